//! The backend through the trait over reliable datagrams (FI_EP_RDM), on
//! libfabric's shm provider and on tcp with ofi_rxm over loopback: our own
//! connection layer (docs/libfabric.md, Connections) with private data,
//! accept, reject, nobody listening, sends, RDMA write and read in order,
//! disconnect on both sides, and a peer gone without a close (broken);
//! rounds of connections between two IAs of one process, empty sends included.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use daplrs_backend::{access, CmEvent, CompletionQueue, Device, RecvWr, SendOp, WcStatus};
use daplrs_libfabric::OfiDevice;

use common::{completion, connect_pair, event, qp, send_wr, sge};

/// The first test of over_tcp.rs, over reliable datagrams, then a peer gone
/// without a close (its QP destroyed): a broken connection, receives flushed.
fn connect_transfer_reject_disconnect(provider: &str) {
    let common::Rig {
        dev,
        rx,
        pd,
        cq_a,
        cq_b,
        mut mine,
        mr_a,
        mr_b,
        theirs: _theirs, // registered as mr_b: kept alive with it
    } = common::connect_transfer_reject_disconnect(provider);
    // A peer gone without a close: broken, what was posted is flushed.
    let (e, f) = (qp(&dev, &pd, &cq_a), qp(&dev, &pd, &cq_b));
    connect_pair(&dev, &rx, &e, &f);
    e.post_recv(RecvWr {
        wr_id: 102,
        ctx: daplrs_backend::WrContext::NONE,
        sgl: vec![sge(&mut mine, 512, 64, mr_a.lkey())].into(),
    })
    .unwrap();
    f.destroy();
    match event(&rx) {
        CmEvent::Broken { qp_num } => assert_eq!(qp_num, e.qp_num()),
        ev => panic!("{ev:?}"),
    }
    let wc = completion(&cq_a);
    assert_eq!((wc.wr_id, wc.status), (102, WcStatus::Flushed));
    mr_a.deregister();
    mr_b.deregister();
    dev.close();
}

#[test]
fn over_shm() {
    connect_transfer_reject_disconnect("shm");
}

#[test]
fn over_tcp_rxm() {
    connect_transfer_reject_disconnect("tcp;ofi_rxm");
}

/// One connection between the two IAs: a send, a disconnect, the QPs freed.
fn round(
    devs: &[Arc<OfiDevice>; 2],
    rx: &Receiver<CmEvent>,
    n: u64,
    cqs: &[Arc<dyn CompletionQueue>; 2],
) {
    let pds = [devs[0].alloc_pd().unwrap(), devs[1].alloc_pd().unwrap()];
    let a = qp(&devs[0], &pds[0], &cqs[0]);
    let b = qp(&devs[1], &pds[1], &cqs[1]);
    let mut mine = vec![0u8; 4096];
    let mut theirs = vec![0u8; 4096];
    let rights = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
    let mr_a = pds[0].reg_mr(mine.as_ptr() as u64, 4096, rights).unwrap();
    let mr_b = pds[1].reg_mr(theirs.as_ptr() as u64, 4096, rights).unwrap();
    b.post_recv(RecvWr {
        wr_id: 100,
        ctx: daplrs_backend::WrContext::NONE,
        sgl: vec![sge(&mut theirs, 0, 64, mr_b.lkey())].into(),
    })
    .unwrap();
    let listener = devs[1].listen(0).unwrap();
    let at = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.port());
    devs[0].connect(&a, at, b"", None).unwrap();
    let req = match event(rx) {
        CmEvent::ConnectRequest { req, .. } => req,
        e => panic!("{e:?}"),
    };
    devs[1].accept(req, &b, b"").unwrap();
    for _ in 0..2 {
        assert!(matches!(event(rx), CmEvent::Established { .. }));
    }
    // Every other round an empty message (shm completes one only without
    // FI_DELIVERY_COMPLETE and without an empty segment).
    let len = if n.is_multiple_of(2) { 0 } else { 5 };
    a.post_send(&send_wr(
        n,
        SendOp::Send,
        vec![sge(&mut mine, 0, len, mr_a.lkey())],
    ))
    .unwrap();
    let wc = completion(&cqs[0]);
    assert_eq!((wc.wr_id, wc.status), (n, WcStatus::Success), "round {n}");
    let wc = completion(&cqs[1]);
    assert_eq!((wc.wr_id, wc.status), (100, WcStatus::Success));
    devs[0].disconnect(&a, false).unwrap();
    for _ in 0..2 {
        assert!(matches!(event(rx), CmEvent::Disconnected { .. }));
    }
    a.destroy();
    b.destroy();
    drop((a, b));
    mr_a.deregister();
    mr_b.deregister();
}

/// Two IAs of one process, as most DAT test programs have them: rounds of
/// connect, send, disconnect and free on the same CQs (shm and ofi_rxm keep
/// state across endpoints of one process: see rdm::Keeper, OfiDevice::closing).
fn two_ias(p: &str) {
    let (devs, rx) = common::two_devices(p);
    let cqs = [
        devs[0].create_cq(64).unwrap(),
        devs[1].create_cq(64).unwrap(),
    ];
    for n in 1..5 {
        round(&devs, &rx, n, &cqs);
    }
}

#[test]
fn two_ias_shm() {
    two_ias("shm");
}

#[test]
fn two_ias_tcp_rxm() {
    two_ias("tcp;ofi_rxm");
}

/// A region stays readable by a peer after 65,536 later registrations
/// (more than the key table has slots): a new key never takes a live key's
/// slot. Before, the peer's read of the live key's entry found the other
/// key and the RDMA read failed REMOTE_ACCESS (on shm, which reads the
/// entry before every request, even on a connection made earlier).
#[test]
fn a_live_key_outlasts_a_full_turn_of_the_key_counter_shm() {
    let common::Rig {
        dev,
        rx,
        pd,
        cq_a,
        cq_b,
        mut mine,
        mr_a,
        mr_b,
        theirs,
    } = common::connect_transfer_reject_disconnect("shm");
    let scratch = [0u8; 64];
    for _ in 0..(1 << 16) + 100 {
        let mr = pd
            .reg_mr(scratch.as_ptr() as u64, 64, access::REMOTE_READ)
            .unwrap();
        mr.deregister();
    }
    let (e, f) = (qp(&dev, &pd, &cq_a), qp(&dev, &pd, &cq_b));
    connect_pair(&dev, &rx, &e, &f);
    let read = SendOp::RdmaRead {
        remote_addr: theirs.as_ptr() as u64 + 100,
        rkey: mr_b.rkey(),
    };
    e.post_send(&send_wr(7, read, vec![sge(&mut mine, 0, 32, mr_a.lkey())]))
        .unwrap();
    let wc = completion(&cq_a);
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
    dev.disconnect(&e, false).unwrap();
    for _ in 0..2 {
        assert!(matches!(event(&rx), CmEvent::Disconnected { .. }));
    }
    e.destroy();
    f.destroy();
    mr_a.deregister();
    mr_b.deregister();
    dev.close();
    drop(theirs);
}
