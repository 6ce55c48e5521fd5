//! A hostile peer against the engine's internals (the end-to-end attack is
//! `tests/hostile_peer.rs`): a panic while serving one connection costs that connection only,
//! and connection requests the consumer leaves unanswered are capped per listener.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use super::super::sys;
use super::super::wire::{self, Header, Kind, Status};
use super::super::TcpDevice;
use super::{Buffer, GUARD_US};
use daplrs_backend::{access, CmEvent, Device, QpCap, QpInit, WcStatus};

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

/// A QP of `dev` with room for `recvs` receives, completing into `cq`.
fn budget_qp(
    dev: &Arc<TcpDevice>,
    pd: &Arc<dyn daplrs_backend::ProtectionDomain>,
    cq: &Arc<dyn daplrs_backend::CompletionQueue>,
) -> Arc<dyn daplrs_backend::QueuePair> {
    dev.create_qp(QpInit {
        pd: pd.clone(),
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap: QpCap {
            max_send_wr: 8,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_rd_atomic: 1,
            max_inline: 0,
        },
    })
    .expect("qp")
}

/// A peer the target's consumer accepted on QP `q`.
fn accepted(
    dev: &Arc<TcpDevice>,
    cm: &mpsc::Receiver<CmEvent>,
    port: u16,
    q: &Arc<dyn daplrs_backend::QueuePair>,
) -> TcpStream {
    let mut s = hello(port);
    dev.accept(request(cm), q, b"").expect("accept");
    assert_eq!(read_header(&mut s).expect("accept").kind, Kind::Accept);
    s
}

fn sends(count: usize, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..count {
        let mut h = Header::new(Kind::Send);
        h.seq = i as u64 + 1;
        wire::put_frame(&mut out, h, payload);
    }
    out
}

/// Waits (up to the hang guard) for `what` of the engine to hold.
fn until(dev: &Arc<TcpDevice>, what: impl Fn(&super::super::engine::Engine) -> bool) {
    let start = std::time::Instant::now();
    while !what(&dev.shared.engine.lock()) {
        assert!(start.elapsed() < guard(), "the engine never got there");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Regression (issue 23): a peer that filled its connection's hold bound (sends with no
/// receive posted, past which the target stops reading) and then closed was never noticed:
/// the EP stayed connected and the memory held. Now (the peer resetting, as ours do when their
/// process ends) its end is seen while held, and once the messages have waited their grace
/// for receives, the connection is reported broken and the memory given back.
#[test]
fn a_peer_that_leaves_with_messages_held_is_noticed() {
    // Closed as a process of ours ends (`liveness::reset_on_exit`): seen at once.
    leave_with_the_hold_bound_full(true, Duration::from_secs(5));
}

/// The same with a plain close, as any program's (not ours) ends: its end of stream stands
/// behind the data the target holds back, and the peer's kernel answers the target's shut
/// window for it forever (no event after 300 s, tried). The held-back connection is still
/// read a little (`Conn::wants_input`), so its end is reached.
#[test]
fn a_peer_that_closes_plainly_behind_held_messages_is_noticed() {
    leave_with_the_hold_bound_full(false, Duration::from_secs(10));
}

/// A peer sends 10 MiB with no receive posted (the target holds 8 MiB, then holds its input
/// back) and leaves, resetting the connection if `abortive`: BROKEN within `within`, and the
/// memory given back.
fn leave_with_the_hold_bound_full(abortive: bool, within: Duration) {
    let (dev, cm) = device();
    let listener = dev.listen(0).expect("listen");
    let pd = dev.alloc_pd().expect("pd");
    let cq = dev.create_cq(64).expect("cq");
    let q = budget_qp(&dev, &pd, &cq);
    let mut s = accepted(&dev, &cm, listener.port(), &q);
    s.set_write_timeout(Some(guard())).expect("hang guard");
    s.write_all(&sends(40, &vec![7u8; 256 << 10]))
        .expect("sends");
    until(&dev, |e| e.peer_memory().used() > 8 << 20);
    if abortive {
        sys::set_abortive_close(s.as_raw_fd(), true).expect("SO_LINGER");
    }
    let left = std::time::Instant::now();
    drop(s);
    match next_event(&cm) {
        CmEvent::Broken { qp_num } => assert_eq!(qp_num, q.qp_num()),
        other => panic!("expected BROKEN, got {other:?}"),
    }
    let took = left.elapsed();
    assert!(took < within, "noticed after {took:?}");
    assert_eq!(
        dev.shared.engine.lock().peer_memory().used(),
        0,
        "memory given back"
    );
    dev.close();
}

/// Messages held when the peer disconnected are still received, in order, if the consumer
/// posts receives within the grace; then the disconnect is reported (it used to be reported
/// at once, and the messages lost).
#[test]
fn messages_held_when_the_peer_left_are_received_then_its_end() {
    let (dev, cm) = device();
    let listener = dev.listen(0).expect("listen");
    let pd = dev.alloc_pd().expect("pd");
    let cq = dev.create_cq(64).expect("cq");
    let q = budget_qp(&dev, &pd, &cq);
    let mut s = accepted(&dev, &cm, listener.port(), &q);
    let mut out = Vec::new();
    for (i, m) in [&b"one"[..], b"two", b"three"].iter().enumerate() {
        let mut h = Header::new(Kind::Send);
        h.seq = i as u64 + 1;
        wire::put_frame(&mut out, h, m);
    }
    wire::put_frame(&mut out, Header::new(Kind::Disconnect), b"");
    s.write_all(&out).expect("sends and disconnect");
    let _ = s.shutdown(std::net::Shutdown::Write);
    until(&dev, |e| e.ended_with_messages_held() == 1);

    let buf = Buffer::new(64);
    let mr = pd.reg_mr(buf.addr(), 64, access::LOCAL_WRITE).expect("mr");
    for i in 0..3u64 {
        let sge = daplrs_backend::Sge {
            addr: buf.addr() + 16 * i,
            length: 16,
            lkey: mr.lkey(),
        };
        q.post_recv(daplrs_backend::RecvWr {
            wr_id: i,
            ctx: daplrs_backend::WrContext::NONE,
            sgl: vec![sge].into(),
        })
        .expect("receive");
    }
    match next_event(&cm) {
        CmEvent::Disconnected { qp_num } => assert_eq!(qp_num, q.qp_num()),
        other => panic!("expected DISCONNECTED, got {other:?}"),
    }
    let mut wcs = Vec::new();
    cq.poll(16, &mut wcs);
    let got: Vec<(u64, WcStatus, u32)> = wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.byte_len))
        .collect();
    assert_eq!(
        got,
        [
            (0, WcStatus::Success, 3),
            (1, WcStatus::Success, 3),
            (2, WcStatus::Success, 5)
        ]
    );
    assert_eq!(buf.read(0, 3), b"one");
    assert_eq!(buf.read(32, 5), b"three");
    dev.close();
}

/// Partial frames count on the device's budget from their header on (issue 23: 20 peers each
/// half-way through a 16 MiB send grew the target by 160 MB): a frame that would take the
/// total past the budget breaks its connection before any of it is kept, and the other
/// peers keep theirs. A large send into a posted receive goes straight in and costs nothing.
#[test]
fn partial_frames_count_on_the_budget_and_breaks_spare_others() {
    let (dev, cm) = device();
    dev.shared.engine.lock().set_peer_memory(40 << 20);
    let listener = dev.listen(0).expect("listen");
    let pd = dev.alloc_pd().expect("pd");
    let cq = dev.create_cq(64).expect("cq");
    let mut hostile = Vec::new();
    for _ in 0..5 {
        let q = budget_qp(&dev, &pd, &cq);
        hostile.push((accepted(&dev, &cm, listener.port(), &q), q));
    }
    for (s, _) in hostile.iter_mut() {
        // The header of a 16 MiB send, and a quarter of its payload; no receive is posted.
        let mut h = Header::new(Kind::Send);
        h.seq = 1;
        h.payload_len = 16 << 20;
        s.write_all(&h.encode()).expect("header");
        s.set_write_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let _ = s.write_all(&vec![1u8; 4 << 20]);
    }
    // Two fit (32 MiB); the other three are broken.
    let mut broken = Vec::new();
    for _ in 0..3 {
        match next_event(&cm) {
            CmEvent::Broken { qp_num } => broken.push(qp_num),
            other => panic!("expected BROKEN, got {other:?}"),
        }
    }
    let qps: Vec<u32> = hostile.iter().map(|(_, q)| q.qp_num()).collect();
    assert_eq!(broken, qps[2..].to_vec());
    assert!(dev.shared.engine.lock().peer_memory().used() <= 40 << 20);

    // A legitimate peer: a 16 MiB send into its posted receive is placed as it arrives.
    let q = budget_qp(&dev, &pd, &cq);
    let buf = Buffer::new(16 << 20);
    let mr = pd
        .reg_mr(buf.addr(), 16 << 20, access::LOCAL_WRITE)
        .expect("mr");
    q.post_recv(daplrs_backend::RecvWr {
        wr_id: 77,
        ctx: daplrs_backend::WrContext::NONE,
        sgl: vec![daplrs_backend::Sge {
            addr: buf.addr(),
            length: 16 << 20,
            lkey: mr.lkey(),
        }]
        .into(),
    })
    .expect("receive");
    let mut s = accepted(&dev, &cm, listener.port(), &q);
    let payload: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
    s.write_all(&sends(1, &payload)).expect("send");
    let ack = read_header(&mut s).expect("an answer");
    assert_eq!((ack.kind, ack.status), (Kind::Ack, Status::Ok));
    let mut wcs = Vec::new();
    let start = std::time::Instant::now();
    while wcs.is_empty() && start.elapsed() < guard() {
        cq.poll(16, &mut wcs);
    }
    let w = wcs
        .iter()
        .find(|w| w.wr_id == 77)
        .expect("the receive completes");
    assert_eq!((w.status, w.byte_len), (WcStatus::Success, 16 << 20));
    assert!(
        buf.read(0, 16 << 20) == payload,
        "the message arrived intact"
    );

    // And a 16 MiB RDMA write goes straight into the memory it names (the two partial frames
    // still hold 32 MiB of the 40: collected whole, it would not fit).
    let target = Buffer::new(16 << 20);
    let wmr = pd
        .reg_mr(
            target.addr(),
            16 << 20,
            access::LOCAL_WRITE | access::REMOTE_WRITE,
        )
        .expect("mr");
    let mut h = Header::new(Kind::Write);
    h.seq = 2;
    h.key = wmr.rkey();
    h.addr = target.addr();
    let mut out = Vec::new();
    wire::put_frame(&mut out, h, &payload);
    s.write_all(&out).expect("write");
    let ack = read_header(&mut s).expect("an answer");
    assert_eq!((ack.kind, ack.status, ack.seq), (Kind::Ack, Status::Ok, 2));
    assert!(
        target.read(0, 16 << 20) == payload,
        "the write arrived intact"
    );
    // One with a key that names nothing is read and dropped, then refused.
    h.seq = 3;
    h.key ^= 0x5555;
    out.clear();
    wire::put_frame(&mut out, h, &payload[..1 << 20]);
    s.write_all(&out).expect("write");
    let ack = read_header(&mut s).expect("an answer");
    assert_eq!(
        (ack.kind, ack.status, ack.seq),
        (Kind::Ack, Status::RemoteAccess, 3)
    );
    match next_event(&cm) {
        CmEvent::Broken { qp_num } => assert_eq!(qp_num, q.qp_num()),
        other => panic!("expected BROKEN, got {other:?}"),
    }
    assert!(dev.shared.engine.lock().peer_memory().used() <= 40 << 20);
    drop(hostile);
    dev.close();
}

/// Regression (issue 23): memory the consumer unmapped while it was registered was copied by
/// the CPU for a peer: the target died of SIGSEGV (or, with something else mapped there
/// since, answered with those bytes). Now each access is refused with REMOTE_ACCESS (which
/// breaks its connection) and the target keeps serving: a small read (copied before its
/// answer goes out), a large one (sent straight from memory after a check), a small write, a
/// large one (streamed into the memory) and an atomic.
#[test]
fn memory_unmapped_while_registered_is_refused_not_read() {
    let (dev, cm) = device();
    let listener = dev.listen(0).expect("listen");
    let pd = dev.alloc_pd().expect("pd");
    let cq = dev.create_cq(64).expect("cq");
    let len = 1usize << 20;
    // SAFETY: a fresh anonymous mapping, unmapped below while only the registration names it.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED);
    let rights = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
    let mr = pd
        .reg_mr(addr as u64, len as u64, rights | access::REMOTE_ATOMIC)
        .expect("mr");
    // SAFETY: our mapping; nothing of ours refers to it any more.
    assert_eq!(unsafe { libc::munmap(addr, len) }, 0);
    let request = |kind: Kind, length: u32| {
        let mut h = Header::new(kind);
        h.seq = 1;
        h.key = mr.rkey();
        h.addr = addr as u64 + 4096;
        h.length = length;
        h
    };
    let mut fetch_add = request(Kind::Atomic, 8);
    fetch_add.flags = wire::FLAG_FETCH_ADD;
    let cases = [
        ("8 B read", request(Kind::ReadReq, 8), Vec::new()),
        (
            "256 KiB read",
            request(Kind::ReadReq, 256 << 10),
            Vec::new(),
        ),
        ("8 B write", request(Kind::Write, 0), vec![1u8; 8]),
        (
            "256 KiB write",
            request(Kind::Write, 0),
            vec![2u8; 256 << 10],
        ),
        ("fetch-and-add", fetch_add, vec![0u8; 16]),
    ];
    for (what, h, payload) in cases {
        let q = budget_qp(&dev, &pd, &cq);
        let mut s = accepted(&dev, &cm, listener.port(), &q);
        let mut out = Vec::new();
        wire::put_frame(&mut out, h, &payload);
        s.write_all(&out).expect(what);
        let a = read_header(&mut s).expect(what);
        assert_eq!(
            (a.status, a.payload_len),
            (Status::RemoteAccess, 0),
            "{what}"
        );
        match next_event(&cm) {
            CmEvent::Broken { qp_num } => assert_eq!(qp_num, q.qp_num(), "{what}"),
            other => panic!("{what}: expected BROKEN, got {other:?}"),
        }
    }
    dev.close();
}
