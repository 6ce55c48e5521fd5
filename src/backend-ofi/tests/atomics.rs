//! 64-bit fetch-and-add and compare-and-swap through the trait, where the
//! provider has them (shm: `fi_query_atomic`): the values they leave, the
//! previous values they return, one completion each, in order behind an
//! earlier RDMA write to the same word; and their refusal where the entry has
//! none (tcp's connected endpoints; tcp;ofi_rxm, whose 1.17 offers FI_ATOMIC
//! only without the send-after-write order the entry is opened with).

mod common;

use std::time::Duration;

use daplrs_backend::{access, Device, Error, SendOp, WcOpcode, WcStatus};

use common::{completion, connect_pair, qp, send_wr, sge};

fn word(buf: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(buf[off..off + 8].try_into().unwrap())
}

/// A write of 100 to the peer's word, then fetch-add 5 (returns 100), a
/// compare-and-swap that matches (105 for 7) and one that does not (1 for 9):
/// each request completes once, in order, with the word's previous value.
fn atomics_in_order(provider: &str) {
    let (dev, rx) = common::one_device(provider);
    assert!(dev.attr().atomics, "{provider} offers 64-bit atomics");
    let pd = dev.alloc_pd().unwrap();
    let (cq_a, cq_b) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
    let (a, b) = (qp(&dev, &pd, &cq_a), qp(&dev, &pd, &cq_b));
    let mut mine = vec![0u8; 4096];
    let theirs = vec![0u8; 4096];
    let rights = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
    let mr_a = pd.reg_mr(mine.as_ptr() as u64, 4096, rights).unwrap();
    let mr_b = pd
        .reg_mr(theirs.as_ptr() as u64, 4096, rights | access::REMOTE_ATOMIC)
        .unwrap();
    connect_pair(&dev, &rx, &a, &b);

    let target = theirs.as_ptr() as u64 + 64;
    let rkey = mr_b.rkey();
    mine[256..264].copy_from_slice(&100u64.to_ne_bytes());
    let write = SendOp::RdmaWrite {
        remote_addr: target,
        rkey,
    };
    let add = SendOp::FetchAdd {
        remote_addr: target,
        rkey,
        add: 5,
    };
    let swap = SendOp::CmpSwap {
        remote_addr: target,
        rkey,
        compare: 105,
        swap: 7,
    };
    let missed = SendOp::CmpSwap {
        remote_addr: target,
        rkey,
        compare: 1,
        swap: 9,
    };
    let lkey = mr_a.lkey();
    a.post_send(&send_wr(1, write, vec![sge(&mut mine, 256, 8, lkey)]))
        .unwrap();
    a.post_send(&send_wr(2, add, vec![sge(&mut mine, 0, 8, lkey)]))
        .unwrap();
    a.post_send(&send_wr(3, swap, vec![sge(&mut mine, 8, 8, lkey)]))
        .unwrap();
    a.post_send(&send_wr(4, missed, vec![sge(&mut mine, 16, 8, lkey)]))
        .unwrap();
    let expected = [
        (1, WcOpcode::RdmaWrite),
        (2, WcOpcode::FetchAdd),
        (3, WcOpcode::CmpSwap),
        (4, WcOpcode::CmpSwap),
    ];
    for (wr_id, opcode) in expected {
        let wc = completion(&cq_a);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (wr_id, WcStatus::Success, opcode, 8)
        );
    }
    // Exactly one completion each: nothing more comes.
    std::thread::sleep(Duration::from_millis(100));
    let mut more = Vec::new();
    assert_eq!(cq_a.poll(4, &mut more), 0, "{more:?}");
    assert_eq!(word(&mine, 0), 100, "fetch-add returns the written value");
    assert_eq!(word(&mine, 8), 105, "compare-and-swap returns the sum");
    assert_eq!(word(&mine, 16), 7, "a missed compare returns the word");
    assert_eq!(
        word(&theirs, 64),
        7,
        "the swap stood, the missed one did not"
    );
    // A word outside the peer's registration: a remote access error, and the
    // connection breaks, as RDMA's does.
    let outside = SendOp::FetchAdd {
        remote_addr: theirs.as_ptr() as u64 + 4096,
        rkey,
        add: 1,
    };
    a.post_send(&send_wr(5, outside, vec![sge(&mut mine, 24, 8, lkey)]))
        .unwrap();
    let wc = completion(&cq_a);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::RemoteAccess));
    // Both sides learn it, in either order.
    let mut broken = [0, 0].map(|_| match common::event(&rx) {
        daplrs_backend::CmEvent::Broken { qp_num } => qp_num,
        e => panic!("{e:?}"),
    });
    broken.sort();
    let mut both = [a.qp_num(), b.qp_num()];
    both.sort();
    assert_eq!(broken, both);
    a.destroy();
    b.destroy();
    mr_a.deregister();
    mr_b.deregister();
    dev.close();
}

#[test]
fn over_shm() {
    atomics_in_order("shm");
}

/// An entry without atomics says so, and a post is refused at once (nothing
/// is queued).
fn refused(provider: &str) {
    let (dev, rx) = common::one_device(provider);
    assert!(!dev.attr().atomics);
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let (a, b) = (qp(&dev, &pd, &cq), qp(&dev, &pd, &cq));
    let mut mine = vec![0u8; 64];
    let mr = pd
        .reg_mr(
            mine.as_ptr() as u64,
            64,
            access::LOCAL_WRITE | access::REMOTE_ATOMIC,
        )
        .unwrap();
    connect_pair(&dev, &rx, &a, &b);
    let add = SendOp::FetchAdd {
        remote_addr: mine.as_ptr() as u64 + 8,
        rkey: mr.rkey(),
        add: 1,
    };
    let lkey = mr.lkey();
    let posted = a.post_send(&send_wr(1, add, vec![sge(&mut mine, 0, 8, lkey)]));
    assert_eq!(posted, Err(Error::Unsupported));
    a.destroy();
    b.destroy();
    mr.deregister();
    dev.close();
}

#[test]
fn refused_over_tcp() {
    refused("tcp");
}

#[test]
fn refused_over_tcp_rxm() {
    refused("tcp;ofi_rxm");
}
