//! A hostile peer against the engine's internals (the end-to-end attack is
//! `tests/hostile_peer.rs`): a panic while serving one connection costs that connection only,
//! and connection requests the consumer leaves unanswered are capped per listener.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use super::super::super::{access, CmEvent, Device, QpCap, QpInit};
use super::super::wire::{self, Header, Kind, Status};
use super::super::TcpDevice;
use super::{Buffer, GUARD_US};

fn guard() -> Duration {
    Duration::from_micros(u64::from(GUARD_US))
}

fn device() -> (Arc<TcpDevice>, mpsc::Receiver<CmEvent>) {
    let dev = TcpDevice::open("127.0.0.1").expect("device");
    let (tx, rx) = mpsc::channel();
    let tx = parking_lot::Mutex::new(tx);
    dev.set_cm_handler(Some(Arc::new(move |ev| {
        let _ = tx.lock().send(ev);
    })));
    (dev, rx)
}

fn hello(port: u16) -> TcpStream {
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
    s.set_read_timeout(Some(guard())).expect("hang guard");
    let mut out = Vec::new();
    wire::put_frame(&mut out, wire::handshake(Kind::Hello), b"");
    s.write_all(&out).expect("hello");
    s
}

fn read_header(s: &mut TcpStream) -> Option<Header> {
    let mut hb = [0u8; wire::HEADER_LEN];
    s.read_exact(&mut hb).ok()?;
    Header::decode(
        &hb,
        &wire::Limits {
            max_message: 1 << 20,
        },
    )
    .ok()
}

/// The next connection event other than ESTABLISHED (which each accept gives).
fn next_event(cm: &mpsc::Receiver<CmEvent>) -> CmEvent {
    loop {
        match cm.recv_timeout(guard()).expect("a connection event") {
            CmEvent::Established { .. } => {}
            other => return other,
        }
    }
}

fn request(cm: &mpsc::Receiver<CmEvent>) -> u64 {
    match next_event(cm) {
        CmEvent::ConnectRequest { req, .. } => req,
        other => panic!("expected a connection request, got {other:?}"),
    }
}

/// Regression: a panic in the progress thread used to end that thread, and with it the service
/// of every connection of the IA. Now it breaks the connection being served and nothing else.
#[test]
fn a_panic_while_serving_a_peer_costs_only_its_connection() {
    let (dev, cm) = device();
    let listener = dev.listen(0).expect("listen");
    let pd = dev.alloc_pd().expect("pd");
    let cq = dev.create_cq(64).expect("cq");
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_rd_atomic: 1,
        max_inline: 0,
    };
    let qp = |_: ()| {
        dev.create_qp(QpInit {
            pd: pd.clone(),
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap,
        })
        .expect("qp")
    };
    let buf = Buffer::new(64);
    let mr = pd
        .reg_mr(buf.addr(), 64, access::LOCAL_WRITE | access::REMOTE_READ)
        .expect("mr");
    let poison = 0x0bad_0bad;
    dev.shared.engine.lock().panic_on_rkey = Some(poison);

    // Two peers, both accepted.
    let mut peers = Vec::new();
    for _ in 0..2 {
        let mut s = hello(listener.port());
        let q = qp(());
        dev.accept(request(&cm), &q, b"").expect("accept");
        assert_eq!(read_header(&mut s).expect("accept").kind, Kind::Accept);
        peers.push((s, q));
    }
    // The first one's request makes the target panic.
    let mut out = Vec::new();
    let mut h = Header::new(Kind::ReadReq);
    h.key = poison;
    h.addr = buf.addr();
    h.length = 8;
    h.seq = 1;
    wire::put_frame(&mut out, h, b"");
    peers[0].0.write_all(&out).expect("poisoned request");
    let mut rest = Vec::new();
    let _ = peers[0].0.read_to_end(&mut rest);
    assert!(rest.is_empty(), "no answer to the request that panicked");
    assert!(matches!(next_event(&cm), CmEvent::Broken { .. }));
    assert_eq!(dev.shared.engine.lock().panics, 1);

    // The other connection is still served by the progress thread, and new peers too.
    let mut out = Vec::new();
    let mut h = Header::new(Kind::ReadReq);
    h.key = mr.rkey();
    h.addr = buf.addr();
    h.length = 8;
    h.seq = 1;
    wire::put_frame(&mut out, h, b"");
    buf.write(0, b"intact!!");
    peers[1].0.write_all(&out).expect("request");
    let answer = read_header(&mut peers[1].0).expect("an answer");
    assert_eq!((answer.kind, answer.status), (Kind::ReadResp, Status::Ok));
    let mut data = [0u8; 8];
    peers[1].0.read_exact(&mut data).expect("data");
    assert_eq!(&data, b"intact!!");
    let _late = hello(listener.port());
    request(&cm);
    dev.close();
}

/// Connection requests the consumer has neither accepted nor rejected are capped per
/// listener: past the cap a HELLO is refused at once (REJECT, not by the peer's consumer).
#[test]
fn unanswered_connection_requests_are_capped() {
    let want = 2 * super::super::engine::MAX_PENDING_REQUESTS as u64 + 256;
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        if r.rlim_cur < want {
            r.rlim_cur = want.min(r.rlim_max.max(want));
            r.rlim_max = r.rlim_max.max(want);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
                r.rlim_cur = r.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &r);
            }
        }
    }
    let (dev, cm) = device();
    let listener = dev.listen(0).expect("listen");
    let mut waiting = Vec::new();
    for _ in 0..super::super::engine::MAX_PENDING_REQUESTS {
        waiting.push(hello(listener.port()));
        request(&cm);
    }
    let mut refused = hello(listener.port());
    let h = read_header(&mut refused).expect("an answer");
    assert_eq!((h.kind, h.status), (Kind::Reject, Status::RemoteInvalid));
    let mut rest = Vec::new();
    let _ = refused.read_to_end(&mut rest);
    // Once one is answered, there is room again.
    drop(waiting.pop());
    assert!(matches!(next_event(&cm), CmEvent::RequestCancelled { .. }));
    let _next = hello(listener.port());
    request(&cm);
    drop(waiting);
    dev.close();
}
