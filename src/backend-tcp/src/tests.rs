//! The TCP backend's own tests: its wire protocol against peers speaking it by hand (fake
//! targets, garbage, silent peers), its sockets (SIGPIPE, resets, low-water marks, TIME_WAIT),
//! its engine's internals, and two IAs on 127.0.0.1 where the behaviour under test is the
//! TCP transport's. The DAT behaviour every device shares is in the `daplrs` crate's
//! behaviour_tests.rs; the helpers (`Side`, `Buffer`, waits) are its testing.rs, included here. Waits use a generous timeout only
//! as a hang guard; readiness is always an event, never a sleep.

use std::io::Write;
use std::net::{Ipv4Addr, TcpStream};
use std::sync::Arc;

use daplrs_backend::Sge;
use daplrs_core::consts::{dto_op, dto_status, event_number, mem_priv};
use daplrs_core::ep::EpState;
use daplrs_core::ep::RemoteBuffer;
use daplrs_core::error::ErrorType;
use daplrs_core::evd::EventData;
use daplrs_core::handle;
use daplrs_core::lmr::{Lmr, LmrRegion, VA_TYPE_VA};
use daplrs_core::sp::Sp;
pub(super) use testing::{
    close, connect_pair, dto, next, next_cr, read_8_bytes, Buffer, Side, GUARD_US,
};

/// The DAT-level test helpers, shared with the `daplrs` crate's behaviour tests (which run them
/// over every device); here over TCP devices only, so much of it goes unused.
#[path = "../../provider/src/testing.rs"]
#[allow(dead_code)]
pub(super) mod testing;

/// What the device factory (`daplrs::device`) does with "tcp <target>", and NoDevice for the
/// rest: testing.rs opens its IAs with this (the core knows no backend).
fn open_device(ia_params: &str) -> daplrs_backend::Result<Arc<dyn daplrs_backend::Device>> {
    match ia_params.split_whitespace().collect::<Vec<_>>()[..] {
        ["tcp", target] => Ok(super::TcpDevice::open(target)?),
        _ => Err(daplrs_backend::Error::NoDevice),
    }
}

#[test]
fn garbled_peer_breaks_only_its_own_connection() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let (_psp, port) = Sp::create_psp_any(&server.ia, &server.cr, 0).expect("psp");
    let mut garbage = TcpStream::connect((Ipv4Addr::LOCALHOST, port as u16)).expect("raw connect");
    garbage.write_all(&[0xffu8; 64]).expect("send garbage");
    // A huge declared length must not be honoured either.
    let mut hostile = TcpStream::connect((Ipv4Addr::LOCALHOST, port as u16)).expect("raw connect");
    let mut h = super::wire::handshake(super::wire::Kind::Hello);
    h.payload_len = u32::MAX;
    hostile.write_all(&h.encode()).expect("send header");

    client
        .ep
        .connect(Ipv4Addr::LOCALHOST, port, GUARD_US, b"real", 0, 0)
        .expect("connect");
    let ev = next(&server.cr);
    let EventData::CrArrival { cr, .. } = ev.data else {
        panic!("no CR")
    };
    let cr = handle::cr(cr).expect("cr");
    assert_eq!(
        &*cr.query().private_data,
        b"real",
        "only the real client became a request"
    );
    cr.accept(Some(&server.ep), b"").expect("accept");
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_ESTABLISHED
    );
    assert_eq!(
        next(&server.conn).number,
        event_number::CONNECTION_ESTABLISHED
    );
    server
        .ep
        .post_recv(&[server.seg(0, 8)], 1, 0)
        .expect("recv");
    client
        .ep
        .post_send(&[client.seg(0, 8)], 2, 0)
        .expect("send");
    assert_eq!(dto(&next(&server.dto)).1, dto_status::SUCCESS);
    drop(garbage);
    drop(hostile);
    close(&[&client, &server]);
}

/// Connects `client` to the fake target listening on `port` (`fake_target`), established.
fn connect_to_fake_target(client: &Side, port: u16) {
    client
        .ep
        .connect(Ipv4Addr::LOCALHOST, u64::from(port), GUARD_US, b"", 0, 0)
        .expect("connect");
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_ESTABLISHED
    );
}

/// A fake target speaking the wire protocol by hand: accepts one connection, answers the
/// HELLO with ACCEPT, then runs `then` on the raw socket.
fn fake_target(
    then: impl FnOnce(TcpStream) + Send + 'static,
) -> (u16, std::thread::JoinHandle<()>) {
    use std::io::Read;
    use std::net::TcpListener;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .expect("hang guard");
        let mut hdr = [0u8; super::wire::HEADER_LEN];
        s.read_exact(&mut hdr).expect("hello header");
        let limits = super::wire::Limits {
            max_message: 1 << 20,
        };
        let h = super::wire::Header::decode(&hdr, &limits).expect("valid hello");
        let mut pd = vec![0u8; h.payload_len as usize];
        s.read_exact(&mut pd).expect("hello payload");
        let mut out = Vec::new();
        super::wire::put_frame(
            &mut out,
            super::wire::handshake(super::wire::Kind::Accept),
            b"",
        );
        s.write_all(&out).expect("accept");
        then(s);
    });
    (port, t)
}

/// A fake target's next request, which must be an RDMA read.
fn fake_read_request(s: &mut TcpStream) -> std::io::Result<super::wire::Header> {
    use std::io::Read;
    let limits = super::wire::Limits {
        max_message: 1 << 20,
    };
    let mut hdr = [0u8; super::wire::HEADER_LEN];
    s.read_exact(&mut hdr)?;
    let h = super::wire::Header::decode(&hdr, &limits).expect("valid header");
    assert_eq!(h.kind, super::wire::Kind::ReadReq);
    Ok(h)
}

/// A fake target's answer to RDMA read `h`: its length in bytes of 7.
fn fake_read_answer(s: &mut TcpStream, h: &super::wire::Header) {
    let mut out = Vec::new();
    let mut resp = super::wire::Header::new(super::wire::Kind::ReadResp);
    resp.seq = h.seq;
    super::wire::put_frame(&mut out, resp, &vec![7u8; h.length as usize]);
    s.write_all(&out).expect("answer");
}

#[test]
fn killed_peer_gives_broken_and_flushed_completions() {
    use std::io::Read;
    let client = Side::new("cli", mem_priv::ALL);
    let (port, t) = fake_target(|mut s| {
        // Wait for the client's first request, then vanish without a goodbye.
        let mut hdr = [0u8; super::wire::HEADER_LEN];
        let _ = s.read_exact(&mut hdr);
        drop(s);
    });
    client
        .ep
        .post_recv(&[client.seg(0, 64)], 1, 0)
        .expect("recv");
    connect_to_fake_target(&client, port);
    client
        .ep
        .post_rdma_read(
            &[client.seg(100, 8)],
            2,
            RemoteBuffer {
                address: 0x1000,
                length: 8,
                rmr_context: 5,
            },
            0,
        )
        .expect("read");
    assert_eq!(next(&client.conn).number, event_number::CONNECTION_BROKEN);
    let mut got = vec![dto(&next(&client.dto)), dto(&next(&client.dto))];
    got.sort();
    assert_eq!(
        got,
        vec![
            (1, dto_status::FLUSHED, 0, dto_op::RECEIVE),
            (2, dto_status::FLUSHED, 0, dto_op::RDMA_READ)
        ]
    );
    t.join().expect("fake target");
    close(&[&client]);
}

#[test]
fn garbage_after_the_handshake_breaks_that_connection() {
    let client = Side::new("cli", mem_priv::ALL);
    let (port, t) = fake_target(|mut s| {
        let _ = s.write_all(&[0xee; 100]);
        // Keep the socket open: the client must break on the garbage itself, not on EOF.
        let mut sink = [0u8; 64];
        let _ = std::io::Read::read(&mut s, &mut sink);
    });
    connect_to_fake_target(&client, port);
    assert_eq!(next(&client.conn).number, event_number::CONNECTION_BROKEN);
    assert_eq!(client.ep.state(), EpState::Disconnected);
    close(&[&client]);
    t.join().expect("fake target");
}

/// Not a test: figures for a quick look (`cargo test -p daplrs --release -- --ignored
/// --nocapture rough_figures`). Nothing is asserted about time.
#[test]
#[ignore]
fn rough_figures() {
    const BIG: usize = 1 << 20;
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    let sbuf = Buffer::new(BIG);
    let cbuf = Buffer::new(BIG);
    let slmr = Lmr::create(
        &server.ia,
        LmrRegion::Virtual {
            address: sbuf.addr(),
            length: BIG as u64,
        },
        &server.pz,
        mem_priv::ALL,
        VA_TYPE_VA,
    )
    .expect("lmr");
    let clmr = Lmr::create(
        &client.ia,
        LmrRegion::Virtual {
            address: cbuf.addr(),
            length: BIG as u64,
        },
        &client.pz,
        mem_priv::ALL,
        VA_TYPE_VA,
    )
    .expect("lmr");
    for size in [8usize, BIG] {
        let iters = if size == 8 { 20_000 } else { 2_000 };
        let remote = RemoteBuffer {
            address: sbuf.addr(),
            length: size as u32,
            rmr_context: slmr.rmr_context(),
        };
        let local = Sge {
            addr: cbuf.addr(),
            length: size as u32,
            lkey: clmr.lmr_context(),
        };
        let start = std::time::Instant::now();
        for i in 0..iters {
            client
                .ep
                .post_rdma_read(&[local], i as u64, remote, 0)
                .expect("read");
            next(&client.dto);
        }
        let el = start.elapsed();
        println!(
            "rdma read {size:>8} B: {:.2} us/op, {:.1} MB/s",
            el.as_secs_f64() * 1e6 / iters as f64,
            (size * iters) as f64 / el.as_secs_f64() / 1e6
        );
    }
    close(&[&client, &server]);
}

#[test]
fn unanswered_connect_times_out_and_flushes() {
    use std::io::Read;
    let client = Side::new("cli", mem_priv::ALL);
    // A peer that takes the TCP connection but never answers the HELLO.
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .expect("hang guard");
        let mut sink = [0u8; 256];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    });
    client
        .ep
        .post_recv(&[client.seg(0, 8)], 4, 0)
        .expect("recv");
    // A short DAT timeout is the behaviour under test, not a measurement.
    client
        .ep
        .connect(Ipv4Addr::LOCALHOST, u64::from(port), 200_000, b"", 0, 0)
        .expect("connect");
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_TIMED_OUT
    );
    assert_eq!(client.ep.state(), EpState::Disconnected);
    assert_eq!(
        dto(&next(&client.dto)),
        (4, dto_status::FLUSHED, 0, dto_op::RECEIVE)
    );
    close(&[&client]);
    t.join().expect("silent peer");
}

/// Waits (readiness, with the hang guard as timeout) until `fd` reports an error or hang-up:
/// the peer's reset has arrived.
fn wait_for_reset(fd: std::os::fd::RawFd) {
    use super::sys::{PollFd, POLLERR, POLLHUP};
    let mut fds = [PollFd::new(fd, 0)];
    let n = super::sys::poll(&mut fds, (GUARD_US / 1000) as i32).expect("poll");
    assert_eq!(n, 1, "no reset within the hang guard");
    assert_ne!(fds[0].revents() & (POLLERR | POLLHUP), 0);
}

#[test]
fn writes_to_a_vanished_peer_raise_no_sigpipe() {
    use super::wire::{Header, Kind, OutQueue};
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;
    // Counts SIGPIPEs of this thread from now on (the test harness otherwise ignores them).
    let before = super::sys::sigpipes_on_this_thread();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let ours = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (peer, _) = listener.accept().expect("accept");
    drop(peer);
    // The first write reaches a closed socket, which answers with a reset; the next fails.
    let mut q = OutQueue::default();
    q.push_frame(Header::new(Kind::Send), vec![1u8; 100]);
    super::engine::send_out(&mut q, &ours).expect("the first write is taken");
    wait_for_reset(ours.as_raw_fd());
    q.push_frame(Header::new(Kind::Send), vec![2u8; 100]);
    let err = super::engine::send_out(&mut q, &ours).expect_err("write after the reset");
    assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
    assert_eq!(
        super::sys::sigpipes_on_this_thread(),
        before,
        "a socket write raised SIGPIPE (no MSG_NOSIGNAL)"
    );
}

/// Our target refuses an access, then closes; the initiator (here by hand) keeps sending. The
/// target must read and discard until the initiator's end of stream: closing with unread input
/// would reset the connection and could destroy the refusal before the initiator reads it.
#[test]
fn refusing_target_closes_without_resetting() {
    use super::wire::{self, Header, Kind, Status};
    use std::io::Read;
    let server = Side::new("srv", mem_priv::ALL);
    server.buf.write(0, &[7u8; 64]);
    let (_psp, port) = Sp::create_psp_any(&server.ia, &server.cr, 0).expect("psp");
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port as u16)).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_micros(u64::from(GUARD_US))))
        .expect("hang guard");
    let mut out = Vec::new();
    wire::put_frame(&mut out, wire::handshake(Kind::Hello), b"");
    s.write_all(&out).expect("hello");
    next_cr(&server.cr)
        .accept(Some(&server.ep), b"")
        .expect("accept");
    let limits = wire::Limits {
        max_message: 16 << 20,
    };
    let read_frame = |s: &mut TcpStream| -> (Header, Vec<u8>) {
        let mut hdr = [0u8; wire::HEADER_LEN];
        s.read_exact(&mut hdr).expect("frame header");
        let h = Header::decode(&hdr, &limits).expect("valid frame");
        let mut p = vec![0u8; h.payload_len as usize];
        s.read_exact(&mut p).expect("payload");
        (h, p)
    };
    assert_eq!(read_frame(&mut s).0.kind, Kind::Accept);
    assert_eq!(
        next(&server.conn).number,
        event_number::CONNECTION_ESTABLISHED
    );
    // A write with a bad rkey, then 8 MiB more the target will not execute.
    let mut out = Vec::new();
    let mut bad = Header::new(Kind::Write);
    bad.seq = 1;
    bad.addr = server.buf.addr();
    bad.key = server.lmr.rmr_context() ^ 0x0100;
    wire::put_frame(&mut out, bad, &[9u8; 16]);
    let mut more = Header::new(Kind::Write);
    more.seq = 2;
    more.addr = server.buf.addr();
    more.key = server.lmr.rmr_context();
    for _ in 0..8 {
        wire::put_frame(&mut out, more, &vec![9u8; 1 << 20]);
        more.seq += 1;
    }
    // A target that closes with this unread resets the connection: the write fails.
    s.write_all(&out)
        .expect("the target reads everything until our end of stream");
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let (h, _) = read_frame(&mut s);
    assert_eq!(
        (h.kind, h.status, h.seq),
        (Kind::Ack, Status::RemoteAccess, 1)
    );
    let mut rest = [0u8; 64];
    match s.read(&mut rest) {
        Ok(0) => {}
        other => panic!("expected the target's end of stream, got {other:?}"),
    }
    assert!(
        s.take_error().expect("SO_ERROR").is_none(),
        "the target reset the connection"
    );
    assert_eq!(next(&server.conn).number, event_number::CONNECTION_BROKEN);
    assert_eq!(
        server.buf.read(0, 64),
        vec![7u8; 64],
        "target memory untouched"
    );
    close(&[&server]);
}

/// The initiator's write fails because the target has reset the connection, while the
/// target's answer to an earlier request still sits unread in the socket: that request
/// completes with the answer's status; only what follows it is flushed. Driven under the
/// engine lock so that the progress thread cannot read the answer first.
#[test]
fn answer_read_before_a_failed_write_is_reported() {
    use super::wire::{self, Header, Kind, Status};
    use daplrs_backend::{
        access, CmEvent, Device, QpCap, QpInit, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
    };
    use std::io::Read;
    use std::sync::mpsc;
    use std::time::Duration;
    let guard = Duration::from_micros(u64::from(GUARD_US));
    let dev = super::TcpDevice::open("127.0.0.1").expect("device");
    let (cm_tx, cm_rx) = mpsc::channel();
    let cm_tx = parking_lot::Mutex::new(cm_tx);
    dev.set_cm_handler(Some(Arc::new(move |ev| {
        let _ = cm_tx.lock().send(ev);
    })));
    let pd = dev.alloc_pd().expect("pd");
    let cq = dev.create_cq(64).expect("cq");
    let (n_tx, n_rx) = mpsc::channel();
    let n_tx = parking_lot::Mutex::new(n_tx);
    cq.set_notify(Some(Arc::new(move || {
        let _ = n_tx.lock().send(());
    })));
    let qp = dev
        .create_qp(QpInit {
            pd: pd.clone(),
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_rd_atomic: 4,
                max_inline: 0,
            },
        })
        .expect("qp");
    let buf = Buffer::new(64);
    let mr = pd.reg_mr(buf.addr(), 64, access::LOCAL_WRITE).expect("mr");
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (port, t) = fake_target(move |mut s| {
        let limits = wire::Limits {
            max_message: 1 << 20,
        };
        let mut hdr = [0u8; wire::HEADER_LEN];
        s.read_exact(&mut hdr).expect("first request");
        let h = Header::decode(&hdr, &limits).expect("valid request");
        let mut p = vec![0u8; h.payload_len as usize];
        s.read_exact(&mut p).expect("its payload");
        // The second request is there, unread, when the socket closes: a reset.
        let mut one = [0u8; 1];
        s.peek(&mut one).expect("second request");
        let mut ack = Header::new(Kind::Ack);
        ack.seq = h.seq;
        ack.status = Status::RemoteAccess;
        let mut out = Vec::new();
        wire::put_frame(&mut out, ack, b"");
        let _ = go_rx.recv_timeout(Duration::from_secs(20));
        s.write_all(&out).expect("answer");
        drop(s);
    });
    dev.connect(
        &qp,
        std::net::SocketAddrV4::new(Ipv4Addr::LOCALHOST, port),
        b"",
        Some(guard),
    )
    .expect("connect");
    assert!(matches!(
        cm_rx.recv_timeout(guard).expect("cm event"),
        CmEvent::Established { .. }
    ));
    let write = |wr_id: u64| SendWr {
        wr_id,
        ctx: daplrs_backend::WrContext::NONE,
        op: SendOp::RdmaWrite {
            remote_addr: 0x1000,
            rkey: 0x5500,
        },
        sgl: vec![Sge {
            addr: buf.addr(),
            length: 16,
            lkey: mr.lkey(),
        }]
        .into(),
        signaled: true,
        solicited: false,
        fence: false,
    };
    let qpn = qp.qp_num();
    // All three posts under one hold of the engine, with the peer's reset in between.
    dev.shared.run(|eng, shared| {
        eng.post_send(shared, qpn, write(1)).expect("post 1");
        eng.post_send(shared, qpn, write(2)).expect("post 2");
        let fd = eng.conn_fd(qpn).expect("connected");
        go_tx.send(()).expect("target waits");
        t.join().expect("fake target");
        wait_for_reset(fd);
        eng.post_send(shared, qpn, write(3))
            .expect("post 3 (its write fails)");
    });
    let mut got: Vec<WorkCompletion> = Vec::new();
    while got.len() < 3 {
        if cq.poll(16, &mut got) == 0 {
            n_rx.recv_timeout(guard)
                .expect("completions before the hang guard");
        }
    }
    let seen: Vec<(u64, WcStatus, WcOpcode)> =
        got.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        seen,
        vec![
            (1, WcStatus::RemoteAccess, WcOpcode::RdmaWrite),
            (2, WcStatus::Flushed, WcOpcode::RdmaWrite),
            (3, WcStatus::Flushed, WcOpcode::RdmaWrite),
        ]
    );
    assert!(matches!(
        cm_rx.recv_timeout(guard).expect("cm event"),
        CmEvent::Broken { .. }
    ));
    dev.close();
}

/// An EP never has more RDMA reads (and atomics) in flight than its max_rdma_read_out: a
/// fake target that does not answer sees exactly that many READ_REQs; answering one lets the
/// next out, and every read completes, in order.
#[test]
fn reads_in_flight_stay_within_max_rdma_read_out() {
    use std::io::Read;
    let client = Side::new("cli", mem_priv::ALL);
    let limit = client.ep.attr().max_rdma_read_out as usize;
    assert!(limit >= 1);
    let total = limit + 2;
    let (port, t) = fake_target(move |mut s| {
        let read_req = fake_read_request;
        let answer = fake_read_answer;
        let mut held: Vec<super::wire::Header> = (0..limit)
            .map(|_| read_req(&mut s).expect("read"))
            .collect();
        // Nothing more comes while `limit` reads are unanswered.
        s.set_read_timeout(Some(std::time::Duration::from_millis(300)))
            .expect("timeout");
        let mut probe = [0u8; 1];
        assert!(
            s.read(&mut probe).is_err(),
            "a read beyond max_rdma_read_out was sent"
        );
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .expect("hang guard");
        // Each answer lets one more out.
        for _ in limit..total {
            let h = held.remove(0);
            answer(&mut s, &h);
            held.push(read_req(&mut s).expect("next read"));
        }
        for h in held {
            answer(&mut s, &h);
        }
        // Until the client says goodbye.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    });
    connect_to_fake_target(&client, port);
    for i in 0..total {
        client
            .ep
            .post_rdma_read(
                &[client.seg(8 * i, 8)],
                i as u64,
                RemoteBuffer {
                    address: 0x1000,
                    length: 8,
                    rmr_context: 5,
                },
                0,
            )
            .expect("read");
    }
    for i in 0..total {
        assert_eq!(
            dto(&next(&client.dto)),
            (i as u64, dto_status::SUCCESS, 8, dto_op::RDMA_READ)
        );
    }
    assert_eq!(client.buf.read(0, 8 * total), vec![7u8; 8 * total]);
    close(&[&client]);
    t.join().expect("fake target");
}

/// A polling consumer with a read outstanding keeps its socket quiet (a raised receive
/// low-water mark: the answer wakes no other thread polling the socket); the mark comes down
/// once the answer is read, and, when the consumer stops looking with a read still
/// outstanding, once its lease ends, so that the progress thread sees the peer's frames again.
#[test]
fn a_polling_consumer_keeps_its_socket_quiet_only_while_it_waits() {
    use std::io::Read;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};
    let client = Side::new("cli", mem_priv::ALL);
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (port, t) = fake_target(move |mut s| {
        for _ in 0..2 {
            let h = fake_read_request(&mut s).expect("read request");
            go_rx
                .recv_timeout(Duration::from_secs(20))
                .expect("go ahead");
            fake_read_answer(&mut s, &h);
        }
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    });
    connect_to_fake_target(&client, port);
    let fd = super::sys::socket_connected_to(port).expect("the client's socket");
    let low_water =
        || super::sys::int_option(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT).expect("SO_RCVLOWAT");
    let read = |id: u64| read_8_bytes(&client, id, 0x1000, 5);
    let guard = Instant::now() + Duration::from_micros(u64::from(GUARD_US));
    assert_eq!(low_water(), 1);

    // Polled until its answer comes.
    read(1);
    let empty = client.dto.dequeue().expect_err("no answer yet");
    assert_eq!(empty.kind, ErrorType::QueueEmpty);
    assert!(low_water() > 1, "not quiet while the read is outstanding");
    go_tx.send(()).expect("go");
    let ev = loop {
        match client.dto.dequeue() {
            Ok(ev) => break ev,
            Err(e) => assert_eq!(e.kind, ErrorType::QueueEmpty),
        }
        assert!(Instant::now() < guard, "no answer before the hang guard");
    };
    assert_eq!(dto(&ev), (1, dto_status::SUCCESS, 8, dto_op::RDMA_READ));
    assert_eq!(low_water(), 1, "still quiet with nothing outstanding");

    // Looked at once, then left alone: the lease ends, and the answer is the progress
    // thread's again.
    read(2);
    let empty = client.dto.dequeue().expect_err("no answer yet");
    assert_eq!(empty.kind, ErrorType::QueueEmpty);
    assert!(low_water() > 1, "not quiet while the read is outstanding");
    while low_water() > 1 {
        assert!(Instant::now() < guard, "still quiet at the hang guard");
        std::thread::sleep(Duration::from_millis(1));
    }
    go_tx.send(()).expect("go");
    assert_eq!(
        dto(&next(&client.dto)),
        (2, dto_status::SUCCESS, 8, dto_op::RDMA_READ)
    );
    close(&[&client]);
    t.join().expect("fake target");
}

#[test]
fn device_mtu_is_what_one_datagram_of_the_interface_carries() {
    use daplrs_backend::Device;
    // Loopback's MTU as the kernel reports it (65536 on Linux unless changed), less the IPv4,
    // UDP and datagram headers, and never more than a UDP datagram holds.
    let lo = std::fs::read_to_string("/sys/class/net/lo/mtu")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let dev = super::TcpDevice::open("127.0.0.1").expect("device");
    let mtu = dev.attr().mtu;
    match lo {
        Some(link) => assert_eq!(mtu, super::wire::ud_max_message(link)),
        None => assert!(mtu >= 512, "mtu {mtu}"),
    }
    dev.close();
}

#[test]
fn spin_window_setting() {
    use super::poll_wait::parse_spin;
    use std::time::Duration;
    assert_eq!(parse_spin(None), Duration::from_micros(50));
    assert_eq!(parse_spin(Some("0")), Duration::ZERO);
    assert_eq!(parse_spin(Some(" 120 ")), Duration::from_micros(120));
    assert_eq!(parse_spin(Some("20000")), Duration::from_micros(50));
    assert_eq!(parse_spin(Some("fast")), Duration::from_micros(50));
}

/// A connection we opened and closed first leaves its ephemeral port in TIME_WAIT; a PSP on
/// that port (DAT programs use fixed qualifiers inside the ephemeral range) must still bind.
/// std's listener sets SO_REUSEADDR; the kernel honours it only if the TIME_WAIT's socket
/// had it too, which is what `connect_reusable` gives our outgoing connections.
#[test]
fn our_closed_connection_does_not_block_a_listener_on_its_port() {
    use std::net::{SocketAddrV4, TcpListener};
    use std::time::Duration;
    // Whether a socket other than our own closed connection (to `server_port`) uses `port`:
    // tests running in parallel may be given the same port for a listener or a connection of
    // theirs (the kernel reuses a TIME_WAIT port for connections elsewhere), and then the
    // experiment is repeated.
    fn in_use(port: u16, server_port: u16) -> bool {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        table.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3
                && f[1].ends_with(&format!(":{port:04X}"))
                && !f[2].ends_with(&format!(":{server_port:04X}"))
        })
    }
    // On a machine that made many connections lately most ephemeral ports hold some other
    // program's TIME_WAIT: try until the kernel gives us a port only we hold.
    for _attempt in 0..500 {
        let server = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("listener");
        let remote = match server.local_addr().expect("addr") {
            std::net::SocketAddr::V4(a) => a,
            other => panic!("{other}"),
        };
        let client = super::sys::connect_reusable(remote, Duration::from_secs(5)).expect("connect");
        let port = client.local_addr().expect("local").port();
        let (accepted, _) = server.accept().expect("accept");
        // We close first: our side of the connection goes to TIME_WAIT.
        drop(client);
        let mut byte = [0u8; 1];
        let _ = std::io::Read::read(&mut &accepted, &mut byte);
        drop(accepted);
        match TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)) {
            Ok(_) => return,
            Err(_) if in_use(port, remote.port()) => continue,
            Err(e) => panic!("bind to {port}: {e}"),
        }
    }
    panic!("500 ports in a row held by other sockets too");
}

/// Connection events reach the consumer in the order the engine made them, whichever thread
/// made them: an accepting thread that has not handed over its ESTABLISHED yet when the
/// progress thread hands over the DISCONNECTED of the same connection must not see the two
/// swapped (the EP, disconnected first, dropped the late ESTABLISHED: Debian's dtestcm server
/// waited forever for its last event).
#[test]
fn connection_events_keep_the_engines_order_across_threads() {
    use daplrs_backend::{CmEvent, Device};
    let dev = super::TcpDevice::open("127.0.0.1").expect("device");
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let log = seen.clone();
    dev.set_cm_handler(Some(Arc::new(move |ev| {
        log.lock().push(match ev {
            CmEvent::Established { qp_num, .. } => ("established", qp_num),
            CmEvent::Disconnected { qp_num } => ("disconnected", qp_num),
            _ => ("other", 0),
        });
    })));
    let shared = dev.shared.clone();
    // The accepting thread: its event is made, not yet handed over.
    let accepted = {
        let mut eng = shared.engine.lock();
        eng.emit(CmEvent::Established {
            qp_num: 7,
            private_data: Vec::new(),
        });
        shared.take_deferred(&mut eng)
    };
    // The progress thread, meanwhile: the peer's DISCONNECT, handed over at once.
    let other = std::thread::scope(|s| {
        s.spawn(|| {
            let disconnected = {
                let mut eng = shared.engine.lock();
                eng.emit(CmEvent::Disconnected { qp_num: 7 });
                shared.take_deferred(&mut eng)
            };
            shared.deliver(disconnected);
        })
        .join()
    });
    assert!(other.is_ok());
    shared.deliver(accepted);
    assert_eq!(*seen.lock(), vec![("established", 7), ("disconnected", 7)]);
    dev.close();
}

mod hostile;
mod samehost;
mod sigio;
mod ud;

/// A closed listener's port is free when `close` returns, even though the progress thread
/// may still be in poll() on its socket (which keeps the socket open until poll returns):
/// a program that frees a PSP and creates another (or an RSP) on the same qualifier must not
/// see DAT_CONN_QUAL_IN_USE because our thread has not run yet.
#[test]
fn a_closed_listeners_port_is_free_at_once() {
    let dev = open_device("tcp lo").expect("device");
    let first = dev.listen(0).expect("listen");
    let port = first.port();
    first.close();
    drop(first);
    for round in 0..500 {
        let again = dev
            .listen(port)
            .unwrap_or_else(|e| panic!("round {round}: listen on {port} again: {e:?}"));
        again.close();
    }
    dev.close();
}
