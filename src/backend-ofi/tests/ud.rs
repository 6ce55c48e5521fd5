//! Datagram QPs through the backend traits (`dgram=udp` beside reliable
//! datagrams): address resolution over our handshake with private data,
//! reject and nobody listening, datagrams both ways after their GRH area,
//! drops counted, a stranger's datagram ignored, receives too small, the
//! largest datagram, disconnect and reset.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use daplrs_backend::{
    access, CmEvent, CompletionQueue, Device, MemoryRegion, QpCap, QpInit, QpState, QueuePair,
    RecvWr, SendOp, SendWr, Sge, UdPeer, WcOpcode, WcStatus, WorkCompletion, GRH_LEN,
};
use daplrs_libfabric::OfiDevice;

const GUARD: Duration = Duration::from_secs(10);

/// A device with one datagram QP, its CQ and a buffer, and its events.
struct Node {
    dev: Arc<OfiDevice>,
    cm: mpsc::Receiver<CmEvent>,
    cq: Arc<dyn CompletionQueue>,
    qp: Arc<dyn QueuePair>,
    buf: Vec<u8>,
    mr: Arc<dyn MemoryRegion>,
}

impl Node {
    fn on(provider: &str) -> Node {
        let dev = OfiDevice::open_with(provider, Some("127.0.0.1"), Some("udp"))
            .expect("reliable datagrams with udp's datagrams on 127.0.0.1");
        assert!(dev.attr().ud, "the entry has datagram QPs");
        let (tx, cm) = mpsc::channel();
        let tx = parking_lot::Mutex::new(tx);
        dev.set_cm_handler(Some(Arc::new(move |ev| {
            let _ = tx.lock().send(ev);
        })));
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(64).expect("cq");
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_rd_atomic: 0,
            max_inline: 0,
        };
        let init = QpInit {
            pd: pd.clone(),
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap,
        };
        let qp = dev.create_ud_qp(init).expect("datagram qp");
        let mut buf = vec![0u8; 64 * 1024];
        let mr = pd
            .reg_mr(
                buf.as_mut_ptr() as u64,
                buf.len() as u64,
                access::LOCAL_WRITE,
            )
            .expect("mr");
        Node {
            dev,
            cm,
            cq,
            qp,
            buf,
            mr,
        }
    }

    fn new() -> Node {
        Node::on("tcp;ofi_rxm")
    }

    fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.buf.as_ptr() as u64 + off as u64,
            length: len,
            lkey: self.mr.lkey(),
        }
    }

    fn write(&mut self, off: usize, data: &[u8]) {
        self.buf[off..off + data.len()].copy_from_slice(data);
    }

    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        // SAFETY: our buffer, written behind Rust's back by the backend.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().add(off), len).to_vec() }
    }

    fn recv(&self, wr_id: u64, off: usize, len: u32) {
        let sgl = vec![self.sge(off, len)].into();
        self.qp
            .post_recv(RecvWr {
                wr_id,
                ctx: daplrs_backend::WrContext::NONE,
                sgl,
            })
            .expect("post recv");
    }

    fn send(&self, wr_id: u64, off: usize, len: u32, to: &UdPeer) {
        let wr = SendWr {
            wr_id,
            ctx: daplrs_backend::WrContext::NONE,
            op: SendOp::Send,
            sgl: vec![self.sge(off, len)].into(),
            signaled: true,
            solicited: false,
            fence: false,
        };
        self.qp
            .post_send_ud(wr, &to.ah, to.qpn)
            .expect("post datagram");
    }

    /// The next completion (polled: the poll reads the datagram QP).
    fn wc(&self) -> WorkCompletion {
        let deadline = Instant::now() + GUARD;
        let mut got = Vec::new();
        while self.cq.poll(1, &mut got) == 0 {
            assert!(Instant::now() < deadline, "no completion");
            std::thread::yield_now();
        }
        got.remove(0)
    }

    fn event(&self) -> CmEvent {
        self.cm.recv_timeout(GUARD).expect("a connection event")
    }

    fn close(self) {
        self.dev.close();
    }
}

/// A resolves B (listening on a port of B's): both learn where the other's QP is.
fn resolve(a: &Node, b: &Node) -> (UdPeer, UdPeer) {
    let listener = b.dev.listen(0).expect("listen");
    let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.port());
    let id = a
        .dev
        .ud_resolve(&a.qp, to, b"asked", Some(GUARD))
        .expect("resolve");
    let CmEvent::UdRequest {
        req, private_data, ..
    } = b.event()
    else {
        panic!("not a datagram request")
    };
    assert_eq!(private_data, b"asked");
    let to_a = b.dev.ud_accept(req, &b.qp, b"answered").expect("accept");
    assert_eq!(to_a.qpn, a.qp.qp_num());
    assert_eq!(to_a.ah.address(), Ipv4Addr::LOCALHOST);
    match a.event() {
        CmEvent::UdResolved {
            id: got,
            peer,
            private_data,
            qp_num,
        } => {
            assert_eq!((got, qp_num), (id, a.qp.qp_num()));
            assert_eq!(private_data, b"answered");
            assert_eq!(peer.qpn, b.qp.qp_num());
            assert_eq!(
                a.qp.state(),
                QpState::Connected,
                "a resolution changes no state"
            );
            listener.close();
            (peer, to_a)
        }
        other => panic!("{other:?}"),
    }
}

fn both_ways(provider: &str) {
    let (mut a, mut b) = (Node::on(provider), Node::on(provider));
    assert_eq!(a.qp.state(), QpState::Connected, "ready at once");
    let (to_b, to_a) = resolve(&a, &b);
    a.write(0, b"from a");
    b.recv(7, 1000, 256);
    a.send(1, 0, 6, &to_b);
    let s = a.wc();
    assert_eq!(
        (s.wr_id, s.status, s.opcode, s.byte_len),
        (1, WcStatus::Success, WcOpcode::Send, 6)
    );
    let r = b.wc();
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, GRH_LEN + 6)
    );
    let grh = b.read(1000, GRH_LEN as usize);
    assert_eq!(grh[0] >> 4, 6, "IP version 6, as an InfiniBand GRH");
    assert_eq!(u16::from_be_bytes([grh[4], grh[5]]), 6, "payload length");
    assert_eq!(grh[6], 0x1b, "next header: IBA transport");
    let mapped = Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets();
    assert_eq!(&grh[8..24], &mapped, "source GID");
    assert_eq!(&grh[24..40], &mapped, "destination GID");
    assert_eq!(b.read(1000 + GRH_LEN as usize, 6), b"from a");

    b.write(0, b"back");
    a.recv(8, 2000, 256);
    b.send(2, 0, 4, &to_a);
    assert_eq!(b.wc().status, WcStatus::Success);
    let r = a.wc();
    assert_eq!((r.wr_id, r.byte_len), (8, GRH_LEN + 4));
    assert_eq!(a.read(2000 + GRH_LEN as usize, 4), b"back");
    a.close();
    b.close();
}

#[test]
fn datagrams_go_both_ways_after_a_grh_area() {
    both_ways("tcp;ofi_rxm");
}

#[test]
fn datagrams_go_both_ways_beside_shm() {
    both_ways("shm");
}

#[test]
fn datagrams_without_a_receive_are_dropped_and_counted() {
    let (mut a, b) = (Node::new(), Node::new());
    let (to_b, _) = resolve(&a, &b);
    a.write(0, b"lost");
    a.send(1, 0, 4, &to_b);
    assert_eq!(a.wc().status, WcStatus::Success, "a send never learns");
    let deadline = Instant::now() + GUARD;
    while b.dev.ud_dropped() == 0 {
        assert!(Instant::now() < deadline, "the datagram was never dropped");
        let mut none = Vec::new();
        assert_eq!(b.cq.poll(1, &mut none), 0, "nothing completes");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(b.dev.ud_dropped(), 1);

    // A stranger's datagram is none of ours: ignored, not taking the
    // receive, not counted as a drop.
    let stranger = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("udp");
    let at = b.qp.local_addr().expect("udp's address");
    stranger
        .send_to(b"not a DAT datagram", at)
        .expect("stranger sends");
    b.recv(9, 0, 256);
    a.write(0, b"found");
    a.send(2, 0, 5, &to_b);
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (9, WcStatus::Success, GRH_LEN + 5)
    );
    assert_eq!(b.read(GRH_LEN as usize, 5), b"found");
    assert_eq!(b.dev.ud_dropped(), 1);
    a.close();
    b.close();
}

#[test]
fn a_datagram_larger_than_its_receive_fails_it_and_stops_the_qp() {
    let (mut a, b) = (Node::new(), Node::new());
    let (to_b, _) = resolve(&a, &b);
    b.recv(1, 0, GRH_LEN + 8);
    b.recv(2, 4096, 256);
    a.send(10, 0, 100, &to_b);
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (1, WcStatus::LocalLength, 0)
    );
    // As a verbs QP in its error state: the rest is flushed, the QP broken.
    let r = b.wc();
    assert_eq!((r.wr_id, r.status), (2, WcStatus::Flushed));
    assert!(matches!(b.event(), CmEvent::Broken { .. }));
    assert_eq!(b.qp.state(), QpState::Error);
    b.qp.reset().expect("reset");
    assert_eq!(b.qp.state(), QpState::Connected);
    b.recv(3, 4096, 256);
    a.send(11, 0, 8, &to_b);
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(b.wc().wr_id, 3);

    // The largest message goes whole: the device's MTU, udp's largest
    // message (1,472 bytes) less our 8-byte header.
    let mtu = a.dev.attr().mtu;
    assert_eq!(mtu, 1464);
    let data: Vec<u8> = (0..mtu).map(|i| (i % 251) as u8).collect();
    a.write(0, &data);
    b.recv(4, 0, GRH_LEN + mtu);
    a.send(12, 0, mtu, &to_b);
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (4, WcStatus::Success, GRH_LEN + mtu)
    );
    assert_eq!(b.read(GRH_LEN as usize, mtu as usize), data);
    // One byte more fails (the core refuses it first) and stops the sender.
    a.send(13, 0, mtu + 1, &to_b);
    assert_eq!(a.wc().status, WcStatus::LocalLength);
    assert!(matches!(a.event(), CmEvent::Broken { .. }));
    a.close();
    b.close();
}

#[test]
fn disconnect_flushes_and_reset_makes_the_qp_ready_again() {
    let (a, b) = (Node::new(), Node::new());
    let (to_b, _) = resolve(&a, &b);
    a.recv(5, 0, 256);
    a.dev.disconnect(&a.qp, true).expect("disconnect");
    assert!(matches!(a.event(), CmEvent::Disconnected { .. }));
    let r = a.wc();
    assert_eq!((r.wr_id, r.status), (5, WcStatus::Flushed));
    assert_eq!(a.qp.state(), QpState::Error);
    a.send(6, 0, 4, &to_b);
    assert_eq!(
        a.wc().status,
        WcStatus::Flushed,
        "sends on an Error QP flush"
    );
    a.qp.reset().expect("reset");
    assert_eq!(a.qp.state(), QpState::Connected);
    b.recv(7, 0, 256);
    a.send(8, 0, 4, &to_b);
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(b.wc().wr_id, 7);
    a.close();
    b.close();
}

#[test]
fn a_reject_nobody_listening_and_a_peer_without_datagrams_fail_the_resolution() {
    let (a, b) = (Node::new(), Node::new());
    let listener = b.dev.listen(0).expect("listen");
    let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.port());
    let id = a.dev.ud_resolve(&a.qp, to, b"may I", Some(GUARD)).unwrap();
    let CmEvent::UdRequest { req, .. } = b.event() else {
        panic!("not a datagram request")
    };
    b.dev.reject(req, b"no").expect("reject");
    match a.event() {
        CmEvent::UdFailed {
            id: got,
            by_peer,
            private_data,
            ..
        } => assert_eq!(
            (got, by_peer, private_data.as_slice()),
            (id, true, &b"no"[..])
        ),
        other => panic!("{other:?}"),
    }
    listener.close();
    // Nobody listening there now.
    let id = a.dev.ud_resolve(&a.qp, to, b"", Some(GUARD)).unwrap();
    assert!(matches!(
        a.event(),
        CmEvent::UdFailed { id: got, by_peer: false, .. } if got == id
    ));
    // A listener of an entry without datagrams closes the request unanswered.
    let plain = OfiDevice::open("tcp;ofi_rxm", Some("127.0.0.1")).expect("plain entry");
    assert!(!plain.attr().ud);
    let listener = plain.listen(0).expect("listen");
    let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.port());
    let id = a.dev.ud_resolve(&a.qp, to, b"", Some(GUARD)).unwrap();
    assert!(matches!(
        a.event(),
        CmEvent::UdFailed { id: got, by_peer: false, .. } if got == id
    ));
    assert_eq!(a.qp.state(), QpState::Connected, "failures change no state");
    listener.close();
    plain.close();
    a.close();
    b.close();
}

#[test]
fn an_entry_of_connected_endpoints_says_why_it_has_no_datagrams() {
    let why = OfiDevice::diagnose_with("tcp", Some("127.0.0.1"), Some("udp")).expect("refused");
    assert!(
        why.contains("dgram=udp") && why.contains("FI_EP_RDM"),
        "{why}"
    );
    let why = OfiDevice::diagnose_with("tcp;ofi_rxm", Some("127.0.0.1"), Some("nosuch"))
        .expect("refused");
    assert!(why.contains("FI_EP_DGRAM"), "{why}");
}
