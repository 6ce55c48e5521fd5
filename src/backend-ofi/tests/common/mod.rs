//! What the tests over each libfabric provider share: the helpers, and the
//! first round (connect with private data, accept, reject, nobody listening,
//! sends, RDMA write and read in order, disconnect on both sides).
#![allow(dead_code)] // each test binary uses its own subset

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use daplrs_backend::{
    access, CmEvent, CompletionQueue, Device, MemoryRegion, ProtectionDomain, QpCap, QpInit,
    QueuePair, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};
use daplrs_libfabric::OfiDevice;

/// Two IAs of `provider` on loopback, their connection events on one channel.
pub fn two_devices(provider: &str) -> ([Arc<OfiDevice>; 2], Receiver<CmEvent>) {
    let devs = [
        OfiDevice::open(provider, Some("127.0.0.1")).unwrap(),
        OfiDevice::open(provider, Some("127.0.0.1")).unwrap(),
    ];
    let (tx, rx) = channel();
    let tx = std::sync::Mutex::new(tx);
    let h: daplrs_backend::CmHandler = Arc::new(move |e| {
        let _ = tx.lock().unwrap().send(e);
    });
    devs[0].set_cm_handler(Some(h.clone()));
    devs[1].set_cm_handler(Some(h));
    (devs, rx)
}

/// One IA of `provider` on loopback, and its connection events.
pub fn one_device(provider: &str) -> (Arc<OfiDevice>, Receiver<CmEvent>) {
    let dev = OfiDevice::open(provider, Some("127.0.0.1")).expect("the provider on 127.0.0.1");
    let (tx, rx) = channel();
    let tx = std::sync::Mutex::new(tx);
    dev.set_cm_handler(Some(Arc::new(move |e| {
        let _ = tx.lock().unwrap().send(e);
    })));
    (dev, rx)
}

pub fn event(rx: &Receiver<CmEvent>) -> CmEvent {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("a connection event")
}

pub fn completion(cq: &Arc<dyn CompletionQueue>) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while cq.poll(1, &mut out) == 0 {
        assert!(Instant::now() < deadline, "no completion");
        std::thread::yield_now();
    }
    out.pop().unwrap()
}

pub fn qp(
    dev: &Arc<OfiDevice>,
    pd: &Arc<dyn daplrs_backend::ProtectionDomain>,
    cq: &Arc<dyn CompletionQueue>,
) -> Arc<dyn QueuePair> {
    qp_of_depth(dev, pd, cq, 16)
}

pub fn qp_of_depth(
    dev: &Arc<OfiDevice>,
    pd: &Arc<dyn daplrs_backend::ProtectionDomain>,
    cq: &Arc<dyn CompletionQueue>,
    depth: u32,
) -> Arc<dyn QueuePair> {
    dev.create_qp(QpInit {
        pd: pd.clone(),
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap: cap(depth),
    })
    .unwrap()
}

/// A QP's capacities: `depth` requests and receives, two segments each.
pub fn cap(depth: u32) -> QpCap {
    QpCap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_rd_atomic: 4,
        max_inline: 0,
    }
}

/// A segment of `buf` (the provider writes through it: taken from a mutable buffer).
pub fn sge(buf: &mut [u8], off: usize, len: usize, lkey: u32) -> Sge {
    Sge {
        addr: buf.as_mut_ptr() as u64 + off as u64,
        length: len as u32,
        lkey,
    }
}

pub fn send_wr(wr_id: u64, op: SendOp, sgl: Vec<Sge>) -> SendWr {
    SendWr {
        wr_id,
        ctx: daplrs_backend::WrContext::NONE,
        op,
        sgl: sgl.into(),
        signaled: true,
        solicited: false,
        fence: false,
    }
}

/// What the first round leaves for a test to go on with: the device, its
/// connection events, a PD, two CQs and two registered buffers.
pub struct Rig {
    pub dev: Arc<OfiDevice>,
    pub rx: Receiver<CmEvent>,
    pub pd: Arc<dyn ProtectionDomain>,
    pub cq_a: Arc<dyn CompletionQueue>,
    pub cq_b: Arc<dyn CompletionQueue>,
    pub mine: Vec<u8>,
    pub theirs: Vec<u8>,
    pub mr_a: Arc<dyn MemoryRegion>,
    pub mr_b: Arc<dyn MemoryRegion>,
}

impl Rig {
    pub fn close(self) {
        self.mr_a.deregister();
        self.mr_b.deregister();
        self.dev.close();
    }
}

/// Connect with private data, accept, reject, nobody listening, sends, RDMA
/// write and read in order, disconnect on both sides, over `provider` on
/// 127.0.0.1.
pub fn connect_transfer_reject_disconnect(provider: &str) -> Rig {
    let (dev, rx) = one_device(provider);
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(64).unwrap();
    let cq_b = dev.create_cq(64).unwrap();
    let a = qp(&dev, &pd, &cq_a);
    let b = qp(&dev, &pd, &cq_b);
    let listener = dev.listen(0).unwrap();
    let at = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.port());

    // Memory: a's source and sink, b's receive area and RDMA target.
    let mut mine = vec![0u8; 4096];
    let mut theirs = vec![0u8; 4096];
    let rights = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
    let mr_a = pd.reg_mr(mine.as_ptr() as u64, 4096, rights).unwrap();
    let mr_b = pd.reg_mr(theirs.as_ptr() as u64, 4096, rights).unwrap();

    // A receive posted before the connection exists is kept until it does.
    b.post_recv(RecvWr {
        wr_id: 100,
        ctx: daplrs_backend::WrContext::NONE,
        sgl: vec![sge(&mut theirs, 0, 64, mr_b.lkey())].into(),
    })
    .unwrap();
    dev.connect(&a, at, b"hello", None).unwrap();
    let req = match event(&rx) {
        CmEvent::ConnectRequest {
            req, private_data, ..
        } => {
            assert_eq!(private_data, b"hello");
            req
        }
        e => panic!("{e:?}"),
    };
    dev.accept(req, &b, b"welcome").unwrap();
    let mut established = Vec::new();
    for _ in 0..2 {
        match event(&rx) {
            CmEvent::Established {
                qp_num,
                private_data,
            } => established.push((qp_num, private_data)),
            e => panic!("{e:?}"),
        }
    }
    established.sort();
    let mut want = vec![(a.qp_num(), b"welcome".to_vec()), (b.qp_num(), Vec::new())];
    want.sort();
    assert_eq!(established, want);

    // A send lands in the receive posted first.
    mine[..5].copy_from_slice(b"data!");
    a.post_send(&send_wr(
        1,
        SendOp::Send,
        vec![sge(&mut mine, 0, 5, mr_a.lkey())],
    ))
    .unwrap();
    let wc = completion(&cq_a);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (1, WcStatus::Success, WcOpcode::Send, 5)
    );
    let wc = completion(&cq_b);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (100, WcStatus::Success, WcOpcode::Recv, 5)
    );
    assert_eq!(&theirs[..5], b"data!");

    // RDMA write then read, completions in posting order.
    // DAT addresses remote memory by virtual address, whatever the provider does.
    let base = theirs.as_ptr() as u64;
    mine[100..108].copy_from_slice(b"written!");
    let write = SendOp::RdmaWrite {
        remote_addr: base + 200,
        rkey: mr_b.rkey(),
    };
    a.post_send(&send_wr(
        2,
        write,
        vec![sge(&mut mine, 100, 8, mr_a.lkey())],
    ))
    .unwrap();
    let read = SendOp::RdmaRead {
        remote_addr: base + 200,
        rkey: mr_b.rkey(),
    };
    a.post_send(&send_wr(3, read, vec![sge(&mut mine, 300, 8, mr_a.lkey())]))
        .unwrap();
    let (w, r) = (completion(&cq_a), completion(&cq_a));
    assert_eq!(
        (w.wr_id, w.status, w.opcode, w.byte_len),
        (2, WcStatus::Success, WcOpcode::RdmaWrite, 8)
    );
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len),
        (3, WcStatus::Success, WcOpcode::RdmaRead, 8)
    );
    assert_eq!(&theirs[200..208], b"written!");
    assert_eq!(&mine[300..308], b"written!");

    // A rejected connection: the consumer's private data comes back.
    let c = qp(&dev, &pd, &cq_a);
    dev.connect(&c, at, b"again", None).unwrap();
    let req = match event(&rx) {
        CmEvent::ConnectRequest { req, .. } => req,
        e => panic!("{e:?}"),
    };
    dev.reject(req, b"no thanks").unwrap();
    match event(&rx) {
        CmEvent::Rejected {
            qp_num,
            private_data,
            by_peer,
        } => {
            assert_eq!(
                (qp_num, private_data.as_slice(), by_peer),
                (c.qp_num(), &b"no thanks"[..], true)
            );
        }
        e => panic!("{e:?}"),
    }

    // Nobody listening: refused, not by a consumer.
    listener.close();
    let d = qp(&dev, &pd, &cq_a);
    let closed = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1);
    dev.connect(&d, closed, b"anyone?", None).unwrap();
    match event(&rx) {
        CmEvent::Rejected {
            qp_num,
            by_peer: false,
            ..
        }
        | CmEvent::Unreachable { qp_num } => assert_eq!(qp_num, d.qp_num()),
        e => panic!("{e:?}"),
    }

    // Disconnect: both sides learn it; a receive still posted is flushed.
    b.post_recv(RecvWr {
        wr_id: 101,
        ctx: daplrs_backend::WrContext::NONE,
        sgl: vec![sge(&mut theirs, 64, 64, mr_b.lkey())].into(),
    })
    .unwrap();
    dev.disconnect(&a, false).unwrap();
    let mut ended = Vec::new();
    for _ in 0..2 {
        match event(&rx) {
            CmEvent::Disconnected { qp_num } => ended.push(qp_num),
            e => panic!("{e:?}"),
        }
    }
    ended.sort();
    assert_eq!(ended, vec![a.qp_num(), b.qp_num()]);
    let wc = completion(&cq_b);
    assert_eq!((wc.wr_id, wc.status), (101, WcStatus::Flushed));
    Rig {
        dev,
        rx,
        pd,
        cq_a,
        cq_b,
        mine,
        theirs,
        mr_a,
        mr_b,
    }
}

/// Connects `a` to `b` through a new listener of `dev`; both see Established.
pub fn connect_pair(
    dev: &Arc<OfiDevice>,
    rx: &Receiver<CmEvent>,
    a: &Arc<dyn QueuePair>,
    b: &Arc<dyn QueuePair>,
) {
    let listener = dev.listen(0).unwrap();
    let at = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.port());
    connect_via(dev, rx, at, a, b);
    listener.close();
}

/// Connects `a` to `b` through the listener of `dev` at `at` (the next
/// request it sees must be `a`'s); both see Established.
pub fn connect_via(
    dev: &Arc<OfiDevice>,
    rx: &Receiver<CmEvent>,
    at: SocketAddrV4,
    a: &Arc<dyn QueuePair>,
    b: &Arc<dyn QueuePair>,
) {
    dev.connect(a, at, b"", None).unwrap();
    let req = match event(rx) {
        CmEvent::ConnectRequest { req, .. } => req,
        e => panic!("{e:?}"),
    };
    dev.accept(req, b, b"").unwrap();
    for _ in 0..2 {
        match event(rx) {
            CmEvent::Established { .. } => {}
            e => panic!("{e:?}"),
        }
    }
}
