//! Registered memory a peer on this host copies through often moves into an arena (the
//! backend's `arenas`): after enough small RDMA writes by cross-memory attach the initiator
//! asks, the target's progress thread has the region's pages moved, and later writes and
//! reads go through the initiator's mapping of it (with the bytes where they belong); the
//! deregistration makes the memory private again.

mod common;

use std::time::{Duration, Instant};

use daplrs_backend::arena::{self, test_pages::Pages};
use daplrs_backend::{access, Device, SendOp, WcOpcode, WcStatus};

use common::{completion, connect_pair, qp, send_wr, sge};

#[test]
fn a_region_written_often_moves_into_an_arena_and_back() {
    let (dev, rx) = common::one_device("shm");
    let pd = dev.alloc_pd().unwrap();
    let (cq_a, cq_b) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
    let (a, b) = (qp(&dev, &pd, &cq_a), qp(&dev, &pd, &cq_b));
    let mut mine = vec![0u8; 4096];
    let theirs = Pages::new(4 * 4096);
    let rights = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
    let mr_a = pd.reg_mr(mine.as_ptr() as u64, 4096, rights).unwrap();
    let mr_b = pd.reg_mr(theirs.addr(), theirs.len as u64, rights).unwrap();
    connect_pair(&dev, &rx, &a, &b);
    assert!(arena::is_private(theirs.addr(), theirs.len as u64));

    let at = |i: u64| theirs.addr() + (i * 8) % theirs.len as u64;
    let mut n = 0u64;
    let mut write = |mine: &mut Vec<u8>| {
        n += 1;
        mine[..8].copy_from_slice(&n.to_ne_bytes());
        let op = SendOp::RdmaWrite {
            remote_addr: at(n),
            rkey: mr_b.rkey(),
        };
        a.post_send(&send_wr(n, op, vec![sge(mine, 0, 8, mr_a.lkey())]))
            .unwrap();
        let c = completion(&cq_a);
        assert_eq!((c.wr_id, c.status), (n, WcStatus::Success));
        // SAFETY: inside the target's pages, which outlive the loop.
        let landed = unsafe { std::ptr::read_volatile(at(n) as *const u64) };
        assert_eq!(landed, n, "write {n} landed");
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while arena::is_private(theirs.addr(), theirs.len as u64) {
        assert!(Instant::now() < deadline, "the region never moved");
        write(&mut mine);
        std::thread::sleep(Duration::from_micros(200));
    }
    for _ in 0..100 {
        write(&mut mine);
    }
    // A read through the arena returns the target's bytes.
    let last = n;
    let op = SendOp::RdmaRead {
        remote_addr: at(last),
        rkey: mr_b.rkey(),
    };
    a.post_send(&send_wr(7, op, vec![sge(&mut mine, 64, 8, mr_a.lkey())]))
        .unwrap();
    let c = completion(&cq_a);
    assert_eq!(
        (c.status, c.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(u64::from_ne_bytes(mine[64..72].try_into().unwrap()), last);

    mr_b.deregister();
    assert!(
        arena::is_private(theirs.addr(), theirs.len as u64),
        "private again once deregistered"
    );
    // SAFETY: inside the target's pages.
    let kept = unsafe { std::ptr::read_volatile(at(last) as *const u64) };
    assert_eq!(kept, last, "bytes kept across the moves");
    mr_a.deregister();
    dev.close();
}
