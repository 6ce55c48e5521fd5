//! The backend through the trait, on libfabric's tcp provider over loopback:
//! connect with private data, accept, reject, nobody listening, sends,
//! RDMA write and read, completions in order, disconnect on both sides;
//! queues deeper than the provider's, memory windows, a write with immediate
//! data, and a refused access breaking the connection on both sides.

mod common;

use std::sync::mpsc::channel;
use std::sync::Arc;

use daplrs_backend::{
    access, CmEvent, CompletionQueue, Device, QpCap, QpInit, RecvWr, SendOp, SendWr, WcOpcode,
    WcStatus,
};
use daplrs_libfabric::OfiDevice;

use common::{completion, connect_pair, event, qp_of_depth, send_wr, sge};

#[test]
fn connect_transfer_reject_disconnect() {
    common::connect_transfer_reject_disconnect("tcp").close();
}

#[test]
fn deep_queues_windows_and_a_refused_access() {
    let dev = OfiDevice::open("tcp", Some("127.0.0.1")).expect("ofi tcp on 127.0.0.1");
    let (tx, rx) = channel();
    let tx = std::sync::Mutex::new(tx);
    dev.set_cm_handler(Some(Arc::new(move |e| {
        let _ = tx.lock().unwrap().send(e);
    })));
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(2048).unwrap();
    let cq_b = dev.create_cq(2048).unwrap();
    // Deeper than tcp's 256 on both queues.
    const N: u64 = 600;
    let a = qp_of_depth(&dev, &pd, &cq_a, N as u32 + 4);
    let b = qp_of_depth(&dev, &pd, &cq_b, N as u32 + 4);
    let mut mine = vec![0u8; 4096];
    let mut theirs = vec![0u8; 8192];
    let rights = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
    let mr_a = pd.reg_mr(mine.as_ptr() as u64, 4096, rights).unwrap();
    let mr_b = pd.reg_mr(theirs.as_ptr() as u64, 8192, rights).unwrap();
    connect_pair(&dev, &rx, &a, &b);

    // N receives and N sends: every one completes, in posting order.
    for i in 0..N {
        let sgl = vec![sge(&mut theirs, 0, 8, mr_b.lkey())];
        b.post_recv(RecvWr {
            wr_id: i,
            ctx: daplrs_backend::WrContext::NONE,
            sgl: sgl.into(),
        })
        .unwrap();
    }
    assert_eq!(b.posted_recvs(), N as u32);
    for i in 0..N {
        let sgl = vec![sge(&mut mine, 0, 8, mr_a.lkey())];
        a.post_send(&send_wr(i, SendOp::Send, sgl)).unwrap();
    }
    for i in 0..N {
        let wc = completion(&cq_a);
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        let wc = completion(&cq_b);
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (i, WcStatus::Success, 8)
        );
    }

    // A window over 256 bytes of b's region: a writes through its key.
    let base = theirs.as_ptr() as u64;
    let mw = pd.alloc_mw().unwrap();
    let rkey = mw.next_rkey();
    let bind = SendOp::BindMw {
        mw: mw.clone(),
        mr: Some(mr_b.clone()),
        addr: base + 1024,
        length: 256,
        access: access::REMOTE_WRITE,
        new_rkey: rkey,
    };
    b.post_send(&SendWr {
        fence: true,
        ..send_wr(7, bind, Vec::new())
    })
    .unwrap();
    let wc = completion(&cq_b);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.new_rkey),
        (7, WcStatus::Success, WcOpcode::BindMw, rkey)
    );
    assert_eq!(mw.rkey(), rkey);
    mine[..6].copy_from_slice(b"window");
    let write = SendOp::RdmaWrite {
        remote_addr: base + 1100,
        rkey,
    };
    a.post_send(&send_wr(8, write, vec![sge(&mut mine, 0, 6, mr_a.lkey())]))
        .unwrap();
    let wc = completion(&cq_a);
    assert_eq!((wc.wr_id, wc.status), (8, WcStatus::Success));
    assert_eq!(&theirs[1100..1106], b"window");

    // A write with immediate data consumes a receive, which carries the
    // data and the write's length.
    let sgl = vec![sge(&mut theirs, 4096, 8, mr_b.lkey())];
    b.post_recv(RecvWr {
        wr_id: 20,
        ctx: daplrs_backend::WrContext::NONE,
        sgl: sgl.into(),
    })
    .unwrap();
    mine[..5].copy_from_slice(b"immed");
    let write = SendOp::RdmaWriteImm {
        remote_addr: base + 2048,
        rkey: mr_b.rkey(),
        imm: 0x1234,
    };
    a.post_send(&send_wr(21, write, vec![sge(&mut mine, 0, 5, mr_a.lkey())]))
        .unwrap();
    let wc = completion(&cq_a);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (21, WcStatus::Success, WcOpcode::RdmaWriteImm, 5)
    );
    let wc = completion(&cq_b);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm),
        (
            20,
            WcStatus::Success,
            WcOpcode::RecvRdmaImm,
            5,
            Some(0x1234)
        )
    );
    assert_eq!(&theirs[2048..2053], b"immed");

    // Past the window's end: a remote access error, and the connection
    // breaks on both sides; the memory is left alone.
    let write = SendOp::RdmaWrite {
        remote_addr: base + 1024 + 254,
        rkey,
    };
    a.post_send(&send_wr(9, write, vec![sge(&mut mine, 0, 6, mr_a.lkey())]))
        .unwrap();
    let wc = completion(&cq_a);
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::RemoteAccess));
    let mut ended = Vec::new();
    for _ in 0..2 {
        match event(&rx) {
            CmEvent::Broken { qp_num } => ended.push(qp_num),
            e => panic!("{e:?}"),
        }
    }
    ended.sort();
    let mut want = vec![a.qp_num(), b.qp_num()];
    want.sort();
    assert_eq!(ended, want);
    assert_eq!(&theirs[1278..1284], &[0u8; 6]);
    mw.dealloc();
    mr_a.deregister();
    mr_b.deregister();
    dev.close();
}

/// Two QPs share one SRQ holding more receives than the provider takes at
/// once: every message lands, each QP consumes receives in posting order, and
/// each completion names the QP that consumed the receive.
#[test]
fn shared_receive_queue() {
    const N: usize = 300;
    let dev = OfiDevice::open("tcp", Some("127.0.0.1")).expect("ofi tcp on 127.0.0.1");
    let (tx, rx) = channel();
    let tx = std::sync::Mutex::new(tx);
    dev.set_cm_handler(Some(Arc::new(move |e| {
        let _ = tx.lock().unwrap().send(e);
    })));
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(1024).unwrap();
    let cq_b = dev.create_cq(1024).unwrap();
    let srq = dev.create_srq(&pd, 1024, 1).unwrap();
    let on_srq = |cq: &Arc<dyn CompletionQueue>| {
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_rd_atomic: 1,
            max_inline: 0,
        };
        dev.create_qp(QpInit {
            pd: pd.clone(),
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: Some(srq.clone()),
            cap,
        })
        .unwrap()
    };
    let (b1, b2) = (on_srq(&cq_b), on_srq(&cq_b));
    let (a1, a2) = (
        qp_of_depth(&dev, &pd, &cq_a, 512),
        qp_of_depth(&dev, &pd, &cq_a, 512),
    );
    let mut src = vec![0u8; N * 8];
    let mut dst = vec![0u8; N * 8];
    let rights = access::LOCAL_WRITE;
    let mr_a = pd
        .reg_mr(src.as_ptr() as u64, src.len() as u64, rights)
        .unwrap();
    let mr_b = pd
        .reg_mr(dst.as_ptr() as u64, dst.len() as u64, rights)
        .unwrap();
    for i in 0..N {
        let sgl = vec![sge(&mut dst, i * 8, 8, mr_b.lkey())].into();
        srq.post_recv(RecvWr {
            wr_id: i as u64,
            ctx: daplrs_backend::WrContext::NONE,
            sgl,
        })
        .unwrap();
    }
    assert_eq!(srq.posted(), N as u32);
    connect_pair(&dev, &rx, &a1, &b1);
    connect_pair(&dev, &rx, &a2, &b2);
    for i in 0..N {
        src[i * 8..i * 8 + 2].copy_from_slice(&(i as u16).to_le_bytes());
        let from = if i % 2 == 0 { &a1 } else { &a2 };
        let sgl = vec![sge(&mut src, i * 8, 8, mr_a.lkey())];
        from.post_send(&send_wr(i as u64, SendOp::Send, sgl))
            .unwrap();
    }
    let (mut on_b1, mut on_b2) = (0, 0);
    let mut last_of = std::collections::HashMap::new();
    for _ in 0..N {
        let wc = completion(&cq_b);
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        assert_eq!((wc.opcode, wc.byte_len), (WcOpcode::Recv, 8));
        // Each QP consumes the SRQ's receives in posting order.
        let last = last_of.entry(wc.qp_num).or_insert(-1i64);
        assert!(wc.wr_id as i64 > *last, "{wc:?} after {last}");
        *last = wc.wr_id as i64;
        if wc.qp_num == b1.qp_num() {
            on_b1 += 1;
        } else {
            assert_eq!(wc.qp_num, b2.qp_num());
            on_b2 += 1;
        }
    }
    assert_eq!((on_b1, on_b2), (N / 2, N / 2));
    assert_eq!(srq.posted(), 0);
    for _ in 0..N {
        assert_eq!(completion(&cq_a).status, WcStatus::Success);
    }
    // Receives are consumed in the order messages arrive, from either QP.
    let mut got: Vec<u16> = (0..N)
        .map(|i| u16::from_le_bytes([dst[i * 8], dst[i * 8 + 1]]))
        .collect();
    got.sort();
    assert_eq!(got, (0..N as u16).collect::<Vec<_>>());
    drop((a1, a2, b1, b2));
}
