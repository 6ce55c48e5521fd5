//! The TCP transport's datagram QPs through the backend traits: address resolution over the
//! handshake (also against peers speaking the wire protocol by hand), datagrams both ways with
//! their GRH area, drops, receives too small, strangers' datagrams, disconnect and reset.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, UdpSocket};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::wire::{self, Header, Kind};
use super::super::TcpDevice;
use super::{fake_target, Buffer, GUARD_US};
use daplrs_backend::{
    access, CmEvent, CompletionQueue, Device, MemoryRegion, QpCap, QpInit, QpState, QueuePair,
    RecvWr, SendOp, SendWr, Sge, UdPeer, WcOpcode, WcStatus, WorkCompletion, GRH_LEN,
};

fn guard() -> Duration {
    Duration::from_micros(u64::from(GUARD_US))
}

/// A device with one datagram QP, its CQ and a buffer, and channels for its events.
struct Node {
    dev: Arc<TcpDevice>,
    cm: mpsc::Receiver<CmEvent>,
    cq: Arc<dyn CompletionQueue>,
    notified: mpsc::Receiver<()>,
    qp: Arc<dyn QueuePair>,
    buf: Buffer,
    mr: Arc<dyn MemoryRegion>,
}

impl Node {
    fn new() -> Node {
        let dev = TcpDevice::open("127.0.0.1").expect("device");
        assert!(dev.attr().ud, "the TCP device has datagram QPs");
        let (cm_tx, cm) = mpsc::channel();
        let cm_tx = parking_lot::Mutex::new(cm_tx);
        dev.set_cm_handler(Some(Arc::new(move |ev| {
            let _ = cm_tx.lock().send(ev);
        })));
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(64).expect("cq");
        let (n_tx, notified) = mpsc::channel();
        let n_tx = parking_lot::Mutex::new(n_tx);
        cq.set_notify(Some(Arc::new(move || {
            let _ = n_tx.lock().send(());
        })));
        let qp = dev
            .create_ud_qp(QpInit {
                pd: pd.clone(),
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                srq: None,
                cap: QpCap {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_rd_atomic: 0,
                    max_inline: 0,
                },
            })
            .expect("datagram qp");
        let buf = Buffer::new(128 * 1024);
        let mr = pd
            .reg_mr(buf.addr(), buf.len() as u64, access::LOCAL_WRITE)
            .expect("mr");
        Node {
            dev,
            cm,
            cq,
            notified,
            qp,
            buf,
            mr,
        }
    }

    /// The QP number on the wire: its UDP port.
    fn qpn(&self) -> u32 {
        u32::from(self.qp.local_addr().expect("bound").port())
    }

    fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.buf.addr() + off as u64,
            length: len,
            lkey: self.mr.lkey(),
        }
    }

    fn recv(&self, wr_id: u64, off: usize, len: u32) {
        self.qp
            .post_recv(RecvWr {
                wr_id,
                ctx: daplrs_backend::WrContext::NONE,
                sgl: vec![self.sge(off, len)].into(),
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

    /// The next completion (hang guard as timeout).
    fn wc(&self) -> WorkCompletion {
        let deadline = Instant::now() + guard();
        loop {
            let mut got = Vec::new();
            if self.cq.poll(1, &mut got) == 1 {
                return got.remove(0);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            self.notified
                .recv_timeout(left)
                .expect("completion before the hang guard");
        }
    }

    fn event(&self) -> CmEvent {
        self.cm.recv_timeout(guard()).expect("cm event")
    }
}

/// A resolves B (listening on a port of B's): both learn where the other's QP is.
fn resolve(a: &Node, b: &Node) -> (UdPeer, UdPeer) {
    let listener = b.dev.listen(0).expect("listen");
    let id = a
        .dev
        .ud_resolve(
            &a.qp,
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.port()),
            b"asked",
            Some(guard()),
        )
        .expect("resolve");
    let CmEvent::UdRequest {
        req, private_data, ..
    } = b.event()
    else {
        panic!("not a datagram request")
    };
    assert_eq!(private_data, b"asked");
    let to_a = b.dev.ud_accept(req, &b.qp, b"answered").expect("accept");
    assert_eq!(to_a.qpn, a.qpn());
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
            assert_eq!(peer.qpn, b.qpn());
            // The QP's state does not change with a resolution.
            assert_eq!(a.qp.state(), QpState::Connected);
            (peer, to_a)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn datagrams_go_both_ways_after_a_grh_area() {
    let (a, b) = (Node::new(), Node::new());
    assert_eq!(a.qp.state(), QpState::Connected, "ready at once");
    let (to_b, to_a) = resolve(&a, &b);
    a.buf.write(0, b"from a");
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
    let grh = b.buf.read(1000, GRH_LEN as usize);
    assert_eq!(grh[0] >> 4, 6, "IP version 6, as an InfiniBand GRH");
    assert_eq!(u16::from_be_bytes([grh[4], grh[5]]), 6, "payload length");
    assert_eq!(grh[6], 0x1b, "next header: IBA transport");
    let mapped = Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets();
    assert_eq!(&grh[8..24], &mapped, "source GID");
    assert_eq!(&grh[24..40], &mapped, "destination GID");
    assert_eq!(b.buf.read(1000 + GRH_LEN as usize, 6), b"from a");

    b.buf.write(0, b"back");
    a.recv(8, 2000, 256);
    b.send(2, 0, 4, &to_a);
    assert_eq!(b.wc().status, WcStatus::Success);
    let r = a.wc();
    assert_eq!((r.wr_id, r.byte_len), (8, GRH_LEN + 4));
    assert_eq!(a.buf.read(2000 + GRH_LEN as usize, 4), b"back");
    a.dev.close();
    b.dev.close();
}

#[test]
fn datagrams_without_a_receive_are_dropped_and_counted() {
    let (a, b) = (Node::new(), Node::new());
    let (to_b, _) = resolve(&a, &b);
    a.buf.write(0, b"lost");
    a.send(1, 0, 4, &to_b);
    assert_eq!(a.wc().status, WcStatus::Success, "a send never learns");
    let deadline = Instant::now() + guard();
    while b.dev.ud_dropped() == 0 {
        assert!(Instant::now() < deadline, "the datagram was never dropped");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(b.dev.ud_dropped(), 1);

    // A stranger's datagram is no datagram of ours: dropped without taking the receive (and
    // not counted as a drop for lack of one).
    let stranger = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("udp");
    stranger
        .send_to(b"not a DAT datagram", (Ipv4Addr::LOCALHOST, b.qpn() as u16))
        .expect("stranger sends");
    b.recv(9, 0, 256);
    a.buf.write(0, b"found");
    a.send(2, 0, 5, &to_b);
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (9, WcStatus::Success, GRH_LEN + 5)
    );
    assert_eq!(b.buf.read(GRH_LEN as usize, 5), b"found");
    assert_eq!(b.dev.ud_dropped(), 1);
    a.dev.close();
    b.dev.close();
}

#[test]
fn a_datagram_larger_than_its_receive_fails_it_and_stops_the_qp() {
    let (a, b) = (Node::new(), Node::new());
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
    // As a verbs QP in its error state: the rest is flushed, the QP is broken.
    let r = b.wc();
    assert_eq!((r.wr_id, r.status), (2, WcStatus::Flushed));
    assert!(matches!(b.event(), CmEvent::Broken { .. }));
    assert_eq!(b.qp.state(), QpState::Error);
    b.qp.reset().expect("reset");
    assert_eq!(b.qp.state(), QpState::Connected);
    b.recv(3, 4096, 256);
    a.send(11, 0, 8, &to_b);
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!((r.wr_id, r.status), (3, WcStatus::Success));

    // The largest message goes whole: the device's MTU.
    let mtu = a.dev.attr().mtu;
    assert_eq!(
        mtu,
        wire::ud_max_message(super::super::sys::interface_mtu(Ipv4Addr::LOCALHOST).unwrap_or(1500))
    );
    let data: Vec<u8> = (0..mtu).map(|i| (i % 251) as u8).collect();
    a.buf.write(0, &data);
    b.recv(4, 0, GRH_LEN + mtu);
    a.send(12, 0, mtu, &to_b);
    assert_eq!(a.wc().status, WcStatus::Success);
    let r = b.wc();
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (4, WcStatus::Success, GRH_LEN + mtu)
    );
    assert_eq!(b.buf.read(GRH_LEN as usize, mtu as usize), data);
    // One byte more is refused by the backend too (the core refuses it first), and stops the
    // sending QP.
    a.send(13, 0, mtu + 1, &to_b);
    assert_eq!(a.wc().status, WcStatus::LocalLength);
    assert!(matches!(a.event(), CmEvent::Broken { .. }));
    a.dev.close();
    b.dev.close();
}

#[test]
fn a_raw_hello_with_the_datagram_flag_is_answered_with_the_qp_number() {
    let b = Node::new();
    let listener = b.dev.listen(0).expect("listen");
    let mut s =
        std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, listener.port())).expect("connect");
    s.set_read_timeout(Some(guard())).expect("hang guard");
    let mut hello = wire::handshake(Kind::Hello);
    hello.flags = wire::FLAG_UD;
    hello.length = 4242;
    let mut out = Vec::new();
    wire::put_frame(&mut out, hello, b"raw");
    s.write_all(&out).expect("hello");
    let CmEvent::UdRequest {
        req, private_data, ..
    } = b.event()
    else {
        panic!("not a datagram request")
    };
    assert_eq!(private_data, b"raw");
    let peer = b.dev.ud_accept(req, &b.qp, b"ok").expect("accept");
    assert_eq!(peer.qpn, 4242);
    let limits = wire::Limits {
        max_message: 1 << 20,
    };
    let mut hdr = [0u8; wire::HEADER_LEN];
    s.read_exact(&mut hdr).expect("answer");
    let h = Header::decode(&hdr, &limits).expect("valid answer");
    assert_eq!(
        (h.kind, h.flags, h.length),
        (Kind::Accept, wire::FLAG_UD, b.qpn())
    );
    let mut pd = vec![0u8; h.payload_len as usize];
    s.read_exact(&mut pd).expect("accept private data");
    assert_eq!(pd, b"ok");
    // Then the connection ends: its work is done.
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).expect("end of stream");
    assert!(rest.is_empty());
    b.dev.close();
}

#[test]
fn a_peer_answering_with_a_connection_or_a_reject_fails_the_resolution() {
    let a = Node::new();
    // A peer that makes it a connection (no FLAG_UD in its ACCEPT).
    let (port, t) = fake_target(drop);
    a.dev
        .ud_resolve(
            &a.qp,
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, port),
            b"",
            Some(guard()),
        )
        .expect("resolve");
    assert!(matches!(
        a.event(),
        CmEvent::UdFailed { by_peer: false, .. }
    ));
    t.join().expect("fake target");

    // A peer whose consumer rejects, with private data.
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = l.local_addr().expect("addr").port();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut hdr = [0u8; wire::HEADER_LEN];
        s.read_exact(&mut hdr).expect("hello");
        let h = Header::decode(
            &hdr,
            &wire::Limits {
                max_message: 1 << 20,
            },
        )
        .expect("hello");
        assert_ne!(h.flags & wire::FLAG_UD, 0);
        let mut pd = vec![0u8; h.payload_len as usize];
        s.read_exact(&mut pd).expect("hello payload");
        let mut out = Vec::new();
        wire::put_frame(&mut out, Header::new(Kind::Reject), b"no");
        s.write_all(&out).expect("reject");
    });
    a.dev
        .ud_resolve(
            &a.qp,
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, port),
            b"",
            Some(guard()),
        )
        .expect("resolve");
    match a.event() {
        CmEvent::UdFailed {
            by_peer,
            private_data,
            ..
        } => assert!(by_peer && private_data == b"no"),
        other => panic!("{other:?}"),
    }
    t.join().expect("rejecting peer");

    // A peer that never answers: the resolution times out.
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = l.local_addr().expect("addr").port();
    let started = Instant::now();
    a.dev
        .ud_resolve(
            &a.qp,
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, port),
            b"",
            Some(Duration::from_millis(200)),
        )
        .expect("resolve");
    assert!(matches!(
        a.event(),
        CmEvent::UdFailed { by_peer: false, .. }
    ));
    assert!(started.elapsed() >= Duration::from_millis(200));
    drop(l);
    a.dev.close();
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
        "sends on an Error QP are flushed"
    );
    a.qp.reset().expect("reset");
    assert_eq!(a.qp.state(), QpState::Connected);
    b.recv(7, 0, 256);
    a.send(8, 0, 4, &to_b);
    assert_eq!(a.wc().status, WcStatus::Success);
    assert_eq!(b.wc().wr_id, 7);
    a.dev.close();
    b.dev.close();
}
