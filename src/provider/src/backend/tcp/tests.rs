//! Two IAs on 127.0.0.1 in one process, driven through the core: connection management, data
//! transfer, remote access enforcement, and failures. Waits use a generous timeout only as a
//! hang guard; readiness is always an event, never a sleep.

use std::io::Write;
use std::net::{Ipv4Addr, TcpStream};
use std::sync::Arc;

use crate::backend::Sge;
use crate::core::consts::{
    close_flags, dto_op, dto_status, ep_state, evd_flags, event_number, mem_priv,
};
use crate::core::cr::Cr;
use crate::core::ep::{Ep, RemoteBuffer};
use crate::core::error::{ErrorType, SubType};
use crate::core::evd::{Evd, Event, EventData};
use crate::core::handle::{self, Handle};
use crate::core::ia::Ia;
use crate::core::lmr::{Lmr, LmrRegion, VA_TYPE_VA};
use crate::core::pz::Pz;
use crate::core::rmr::Rmr;
use crate::core::sp::Sp;

const GUARD_US: u32 = 20_000_000;

/// Memory the transport writes behind Rust's back: accessed only through its raw pointer.
/// A mapping of its own, zero-filled: two heap buffers may share a page, and a region with a
/// page in another region's arena gets none (samehost/arena.rs), which tests of the same-host
/// path must not depend on.
pub(super) struct Buffer {
    pages: super::samehost::arena::tests::Pages,
    len: usize,
}

impl Buffer {
    fn new(len: usize) -> Buffer {
        let pages = super::samehost::arena::tests::Pages::new(len.max(1));
        Buffer { pages, len }
    }
    fn addr(&self) -> u64 {
        self.pages.addr()
    }
    fn len(&self) -> usize {
        debug_assert!(self.len <= self.pages.len);
        self.len
    }
    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len());
        let mut out = vec![0u8; len];
        // SAFETY: in bounds of our allocation; the transport is quiescent for this range once
        // the completion we waited for was delivered.
        unsafe { std::ptr::copy_nonoverlapping(self.pages.ptr.add(off), out.as_mut_ptr(), len) };
        out
    }
    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len());
        // SAFETY: in bounds; no transfer targets this range while the test writes it.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.pages.ptr.add(off), data.len())
        };
    }
}

struct Side {
    ia: Arc<Ia>,
    pz: Arc<Pz>,
    dto: Arc<Evd>,
    conn: Arc<Evd>,
    cr: Arc<Evd>,
    ep: Arc<Ep>,
    buf: Buffer,
    lmr: Arc<Lmr>,
}

impl Side {
    /// Registers another buffer of this side's, with every privilege.
    fn register(&self, buf: &Buffer) -> Arc<Lmr> {
        Lmr::create(
            &self.ia,
            LmrRegion::Virtual {
                address: buf.addr(),
                length: buf.len() as u64,
            },
            &self.pz,
            mem_priv::ALL,
            VA_TYPE_VA,
        )
        .expect("lmr")
    }

    fn new(name: &str, privileges: u32) -> Side {
        let (ia, _) = Ia::open(name, "tcp 127.0.0.1", Some(16), 0).expect("open IA");
        let pz = Pz::create(&ia).expect("pz");
        let dto =
            Evd::create(&ia, 64, None, evd_flags::DTO | evd_flags::RMR_BIND).expect("dto evd");
        let conn = Evd::create(&ia, 16, None, evd_flags::CONNECTION).expect("conn evd");
        let cr = Evd::create(&ia, 16, None, evd_flags::CR).expect("cr evd");
        let ep = Ep::create(
            &ia,
            Some(pz.clone()),
            Some(dto.clone()),
            Some(dto.clone()),
            Some(conn.clone()),
            None,
            None,
        )
        .expect("ep");
        let buf = Buffer::new(4096);
        let lmr = Lmr::create(
            &ia,
            LmrRegion::Virtual {
                address: buf.addr(),
                length: buf.len() as u64,
            },
            &pz,
            privileges,
            VA_TYPE_VA,
        )
        .expect("lmr");
        Side {
            ia,
            pz,
            dto,
            conn,
            cr,
            ep,
            buf,
            lmr,
        }
    }

    fn seg(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.buf.addr() + off as u64,
            length: len,
            lkey: self.lmr.lmr_context(),
        }
    }

    fn remote(&self, off: usize, len: u32) -> RemoteBuffer {
        RemoteBuffer {
            address: self.buf.addr() + off as u64,
            length: len,
            rmr_context: self.lmr.rmr_context(),
        }
    }
}

/// Posts an 8-byte RDMA read on `side`'s EP into the start of its buffer, cookie `id`.
fn read_8_bytes(side: &Side, id: u64, address: u64, rmr_context: u32) {
    side.ep
        .post_rdma_read(
            &[side.seg(0, 8)],
            id,
            RemoteBuffer {
                address,
                length: 8,
                rmr_context,
            },
            0,
        )
        .expect("read");
}

fn next(evd: &Evd) -> Event {
    evd.wait(GUARD_US, 1)
        .expect("event before the hang guard")
        .0
}

fn dto(ev: &Event) -> (u64, u32, u32, u32) {
    match ev.data {
        EventData::Dto {
            cookie,
            status,
            transferred,
            op,
            ..
        } => (cookie, status, transferred, op),
        ref other => panic!(
            "expected a DTO completion, got {:?} ({:#x})",
            other, ev.number
        ),
    }
}

/// Connects client to server through a PSP, with private data both ways.
fn connect_pair(server: &Side, client: &Side) -> Arc<Sp> {
    let (psp, port) = Sp::create_psp_any(&server.ia, &server.cr, 0).expect("psp");
    client
        .ep
        .connect(Ipv4Addr::LOCALHOST, port, GUARD_US, b"hello", 0, 0)
        .expect("connect");
    let ev = next(&server.cr);
    assert_eq!(ev.number, event_number::CONNECTION_REQUEST);
    let EventData::CrArrival {
        cr, conn_qual, sp, ..
    } = ev.data
    else {
        panic!("not a CR arrival")
    };
    assert_eq!((conn_qual, sp), (port, psp.handle()));
    let cr: Arc<Cr> = handle::cr(cr).expect("live CR");
    assert_eq!(&*cr.query().private_data, b"hello");
    cr.accept(Some(&server.ep), b"welcome").expect("accept");
    assert!(handle::cr(cr.handle()).is_err(), "accept consumes the CR");
    let ev = next(&server.conn);
    assert_eq!(ev.number, event_number::CONNECTION_ESTABLISHED);
    let ev = next(&client.conn);
    assert_eq!(ev.number, event_number::CONNECTION_ESTABLISHED);
    match ev.data {
        EventData::Connection { ep, private_data } => {
            assert_eq!(ep, client.ep.handle());
            assert_eq!(&*private_data, b"welcome");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(client.ep.state(), ep_state::CONNECTED);
    assert_eq!(server.ep.state(), ep_state::CONNECTED);
    psp
}

fn close(sides: &[&Side]) {
    for s in sides {
        s.ia.close(close_flags::ABRUPT).expect("close IA");
    }
}

#[test]
fn send_and_receive_with_multi_segment_iovs() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    server
        .ep
        .post_recv(&[server.seg(0, 8), server.seg(100, 56)], 11, 0)
        .expect("recv");
    server
        .ep
        .post_recv(&[server.seg(200, 16)], 12, 0)
        .expect("recv for empty message");
    let _psp = connect_pair(&server, &client);

    client.buf.write(0, b"0123456789abcdefghij");
    client
        .ep
        .post_send(&[client.seg(0, 5), client.seg(5, 15)], 21, 0)
        .expect("send");
    client.ep.post_send(&[], 22, 0).expect("zero-length send");

    assert_eq!(
        dto(&next(&server.dto)),
        (11, dto_status::SUCCESS, 20, dto_op::RECEIVE)
    );
    assert_eq!(server.buf.read(0, 8), b"01234567");
    assert_eq!(server.buf.read(100, 12), b"89abcdefghij");
    assert_eq!(
        server.buf.read(112, 4),
        vec![0u8; 4],
        "nothing past the message"
    );
    assert_eq!(
        dto(&next(&server.dto)),
        (12, dto_status::SUCCESS, 0, dto_op::RECEIVE)
    );
    assert_eq!(
        dto(&next(&client.dto)),
        (21, dto_status::SUCCESS, 20, dto_op::SEND)
    );
    assert_eq!(
        dto(&next(&client.dto)),
        (22, dto_status::SUCCESS, 0, dto_op::SEND)
    );

    // A send posted before its receive waits for it (no loss, in order).
    client
        .ep
        .post_send(&[client.seg(0, 4)], 23, 0)
        .expect("send early");
    client
        .ep
        .post_send(&[client.seg(4, 4)], 24, 0)
        .expect("send early 2");
    server
        .ep
        .post_recv(&[server.seg(300, 4)], 13, 0)
        .expect("late recv");
    server
        .ep
        .post_recv(&[server.seg(304, 4)], 14, 0)
        .expect("late recv 2");
    assert_eq!(
        dto(&next(&server.dto)),
        (13, dto_status::SUCCESS, 4, dto_op::RECEIVE)
    );
    assert_eq!(
        dto(&next(&server.dto)),
        (14, dto_status::SUCCESS, 4, dto_op::RECEIVE)
    );
    assert_eq!(server.buf.read(300, 8), b"01234567");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);
    assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);

    // SUPPRESS: a successful completion is not reported.
    server
        .ep
        .post_recv(&[server.seg(400, 8)], 15, 0)
        .expect("recv");
    client
        .ep
        .post_send(&[client.seg(0, 8)], 25, 1)
        .expect("suppressed send");
    assert_eq!(dto(&next(&server.dto)).0, 15);
    client.ep.post_send(&[], 26, 0).expect("marker send");
    server.ep.post_recv(&[], 16, 0).expect("recv marker");
    assert_eq!(
        dto(&next(&client.dto)).0,
        26,
        "suppressed completion must not appear"
    );
    close(&[&client, &server]);
}

#[test]
fn rdma_write_and_read_are_served_by_the_target() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    server.buf.write(1000, b"server-owned bytes");

    client.buf.write(0, b"written by the client");
    client
        .ep
        .post_rdma_write(
            &[client.seg(0, 10), client.seg(10, 11)],
            1,
            server.remote(2000, 21),
            0,
        )
        .expect("write");
    assert_eq!(
        dto(&next(&client.dto)),
        (1, dto_status::SUCCESS, 21, dto_op::RDMA_WRITE)
    );
    assert_eq!(server.buf.read(2000, 21), b"written by the client");

    // Read fills front segments completely.
    client
        .ep
        .post_rdma_read(
            &[client.seg(500, 6), client.seg(600, 100)],
            2,
            server.remote(1000, 18),
            0,
        )
        .expect("read");
    assert_eq!(
        dto(&next(&client.dto)),
        (2, dto_status::SUCCESS, 18, dto_op::RDMA_READ)
    );
    assert_eq!(client.buf.read(500, 6), b"server");
    assert_eq!(client.buf.read(600, 12), b"-owned bytes");
    assert_eq!(client.buf.read(612, 4), vec![0u8; 4]);

    // Local buffer too small for the remote buffer: synchronous LENGTH_ERROR.
    let e = client
        .ep
        .post_rdma_read(&[client.seg(0, 4)], 3, server.remote(0, 8), 0)
        .expect_err("too small");
    assert_eq!(e.kind, ErrorType::LengthError);
    // The server application called nothing: its DTO EVD saw nothing.
    assert_eq!(
        server.dto.dequeue().expect_err("no target events").kind,
        ErrorType::QueueEmpty
    );
    close(&[&client, &server]);
}

/// An RDMA read past the end of the server's region: REMOTE_ACCESS, and the connection breaks.
fn out_of_range_read_breaks_the_connection(server: &Side, client: &Side) {
    client
        .ep
        .post_rdma_read(&[client.seg(0, 32)], 1, server.remote(4090, 32), 0)
        .expect("post out of range");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::REMOTE_ACCESS);
    assert_eq!(next(&client.conn).number, event_number::CONNECTION_BROKEN);
}

/// An RDMA write under a wrong rkey, and one behind it: REMOTE_ACCESS, then FLUSHED, BROKEN on
/// both sides, the target's memory untouched.
fn bad_rkey_write_breaks_the_connection(server: &Side, client: &Side) {
    server.buf.write(0, &[7u8; 64]);
    let mut bad = server.remote(0, 16);
    bad.rmr_context ^= 0x0100;
    client
        .ep
        .post_rdma_write(&[client.seg(0, 16)], 1, bad, 0)
        .expect("post with a bad rkey");
    client
        .ep
        .post_rdma_write(&[client.seg(0, 16)], 2, server.remote(0, 16), 0)
        .expect("post behind it");
    assert_eq!(
        dto(&next(&client.dto)),
        (1, dto_status::REMOTE_ACCESS, 0, dto_op::RDMA_WRITE)
    );
    assert_eq!(
        dto(&next(&client.dto)),
        (2, dto_status::FLUSHED, 0, dto_op::RDMA_WRITE)
    );
    assert_eq!(next(&client.conn).number, event_number::CONNECTION_BROKEN);
    assert_eq!(next(&server.conn).number, event_number::CONNECTION_BROKEN);
    assert_eq!(
        server.buf.read(0, 64),
        vec![7u8; 64],
        "target memory untouched"
    );
}

#[test]
fn remote_access_violation_breaks_the_connection() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    bad_rkey_write_breaks_the_connection(&server, &client);
    assert_eq!(client.ep.state(), ep_state::DISCONNECTED);

    // Posts on a DISCONNECTED EP succeed and are flushed at once.
    client
        .ep
        .post_send(&[client.seg(0, 8)], 3, 0)
        .expect("post while disconnected");
    assert_eq!(
        dto(&next(&client.dto)),
        (3, dto_status::FLUSHED, 0, dto_op::SEND)
    );
    client.ep.reset().expect("reset");
    assert_eq!(client.ep.state(), ep_state::UNCONNECTED);
    close(&[&client, &server]);
}

#[test]
fn out_of_range_and_missing_privilege_are_refused_by_the_target() {
    // The target's LMR grants remote read only.
    let server = Side::new(
        "srv",
        mem_priv::LOCAL_READ | mem_priv::LOCAL_WRITE | mem_priv::REMOTE_READ,
    );
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    out_of_range_read_breaks_the_connection(&server, &client);

    let server2 = Side::new(
        "srv2",
        mem_priv::LOCAL_READ | mem_priv::LOCAL_WRITE | mem_priv::REMOTE_READ,
    );
    let client2 = Side::new("cli2", mem_priv::ALL);
    let _psp2 = connect_pair(&server2, &client2);
    client2
        .ep
        .post_rdma_write(&[client2.seg(0, 8)], 2, server2.remote(0, 8), 0)
        .expect("post write");
    assert_eq!(dto(&next(&client2.dto)).1, dto_status::REMOTE_ACCESS);
    assert_eq!(server2.buf.read(0, 8), vec![0u8; 8]);
    close(&[&client, &server, &client2, &server2]);
}

#[test]
fn graceful_disconnect_flushes_receives() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    server
        .ep
        .post_recv(&[server.seg(0, 64)], 9, 0)
        .expect("recv");
    client
        .ep
        .disconnect(close_flags::GRACEFUL)
        .expect("disconnect");
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_DISCONNECTED
    );
    assert_eq!(
        next(&server.conn).number,
        event_number::CONNECTION_DISCONNECTED
    );
    assert_eq!(
        dto(&next(&server.dto)),
        (9, dto_status::FLUSHED, 0, dto_op::RECEIVE)
    );
    assert_eq!(server.ep.state(), ep_state::DISCONNECTED);
    client
        .ep
        .disconnect(close_flags::GRACEFUL)
        .expect("disconnect again is a no-op");
    close(&[&client, &server]);
}

#[test]
fn peer_that_vanishes_gives_broken_and_flushes() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    client
        .ep
        .post_recv(&[client.seg(0, 64)], 5, 0)
        .expect("recv");
    client
        .ep
        .post_rdma_read(&[client.seg(100, 8)], 6, server.remote(0, 8), 0)
        .expect("read");
    // The read may complete before the peer goes; either way nothing is lost.
    server
        .ia
        .close(close_flags::ABRUPT)
        .expect("server vanishes");
    let mut saw_recv = false;
    let mut saw_conn = false;
    while !(saw_recv && saw_conn) {
        let ev = next(&client.dto);
        let (cookie, status, _, _) = dto(&ev);
        if cookie == 5 {
            assert_eq!(status, dto_status::FLUSHED);
            saw_recv = true;
        }
        if !saw_conn {
            if let Ok(c) = client.conn.dequeue() {
                assert!(matches!(
                    c.number,
                    event_number::CONNECTION_BROKEN | event_number::CONNECTION_DISCONNECTED
                ));
                saw_conn = true;
            } else if saw_recv {
                let c = next(&client.conn);
                assert!(matches!(
                    c.number,
                    event_number::CONNECTION_BROKEN | event_number::CONNECTION_DISCONNECTED
                ));
                saw_conn = true;
            }
        }
    }
    close(&[&client]);
}

#[test]
fn reject_and_unreachable_ports() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let (psp, port) = Sp::create_psp_any(&server.ia, &server.cr, 0).expect("psp");
    client
        .ep
        .connect(Ipv4Addr::LOCALHOST, port, GUARD_US, b"let me in", 0, 0)
        .expect("connect");
    let EventData::CrArrival { cr, .. } = next(&server.cr).data else {
        panic!("no CR")
    };
    handle::cr(cr)
        .expect("cr")
        .reject(b"go away")
        .expect("reject");
    let ev = next(&client.conn);
    assert_eq!(ev.number, event_number::CONNECTION_PEER_REJECTED);
    assert!(
        matches!(ev.data, EventData::Connection { ref private_data, .. } if &**private_data == b"go away")
    );
    assert_eq!(client.ep.state(), ep_state::DISCONNECTED);
    client.ep.reset().expect("reset");

    // Nobody listens on a port we just released.
    psp.free().expect("free psp");
    client
        .ep
        .connect(Ipv4Addr::LOCALHOST, port, GUARD_US, b"", 0, 0)
        .expect("connect");
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_NON_PEER_REJECTED
    );

    // Connect is refused synchronously outside UNCONNECTED.
    let e = client
        .ep
        .connect(Ipv4Addr::LOCALHOST, port, GUARD_US, b"", 0, 0)
        .expect_err("disconnected");
    assert_eq!(
        (e.kind, e.sub),
        (ErrorType::InvalidState, SubType::EpDisconnected)
    );
    close(&[&client, &server]);
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

#[test]
fn rmr_bind_exposes_part_of_an_lmr() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    let rmr = Rmr::create(&server.pz).expect("rmr");
    let ctx = rmr
        .bind(
            Some(&server.lmr),
            (server.buf.addr() + 1024, 256, server.lmr.lmr_context()),
            mem_priv::REMOTE_WRITE,
            VA_TYPE_VA,
            &server.ep,
            99,
            0,
        )
        .expect("bind");
    let ev = next(&server.dto);
    assert_eq!(ev.number, event_number::RMR_BIND_COMPLETION);
    assert_eq!(
        ev.data,
        EventData::RmrBind {
            rmr: rmr.handle(),
            cookie: 99,
            status: 0
        }
    );
    assert_eq!(rmr.query().rmr_context, ctx);
    assert_eq!(
        server.lmr.free().expect_err("lmr bound by an rmr").sub,
        SubType::LmrInUse
    );

    client.buf.write(0, b"through a window");
    let window = RemoteBuffer {
        address: server.buf.addr() + 1024,
        length: 16,
        rmr_context: ctx,
    };
    client
        .ep
        .post_rdma_write(&[client.seg(0, 16)], 1, window, 0)
        .expect("write via rmr");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);
    assert_eq!(server.buf.read(1024, 16), b"through a window");

    // Outside the window (but inside the LMR) is a violation.
    let outside = RemoteBuffer {
        address: server.buf.addr(),
        length: 16,
        rmr_context: ctx,
    };
    client
        .ep
        .post_rdma_write(&[client.seg(0, 16)], 2, outside, 0)
        .expect("post");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::REMOTE_ACCESS);
    assert_eq!(server.buf.read(0, 16), vec![0u8; 16]);
    rmr.free().expect("free rmr");
    server.lmr.free().expect("lmr free once unbound");
    let _ = Handle::NULL;
    close(&[&client, &server]);
}

/// Waits for a CR on `evd` and returns it.
fn next_cr(evd: &Evd) -> Arc<Cr> {
    let ev = next(evd);
    let EventData::CrArrival { cr, .. } = ev.data else {
        panic!("expected a CR, got {ev:?}")
    };
    handle::cr(cr).expect("live CR")
}

#[test]
fn srq_feeds_receives_of_several_connections() {
    use crate::core::srq::{Srq, SrqAttr};
    let server = Side::new("srv", mem_priv::ALL);
    let c1 = Side::new("c1", mem_priv::ALL);
    let c2 = Side::new("c2", mem_priv::ALL);
    let srq = Srq::create(
        &server.ia,
        &server.pz,
        SrqAttr {
            max_recv_dtos: 8,
            max_recv_iov: 1,
            low_watermark: 0,
        },
    )
    .expect("srq");
    let ep_a = Ep::create(
        &server.ia,
        Some(server.pz.clone()),
        Some(server.dto.clone()),
        Some(server.dto.clone()),
        Some(server.conn.clone()),
        Some(srq.clone()),
        None,
    )
    .expect("ep a");
    let ep_b = Ep::create(
        &server.ia,
        Some(server.pz.clone()),
        Some(server.dto.clone()),
        Some(server.dto.clone()),
        Some(server.conn.clone()),
        Some(srq.clone()),
        None,
    )
    .expect("ep b");
    assert_eq!(
        ep_a.post_recv(&[server.seg(0, 8)], 1, 0)
            .expect_err("EP with SRQ")
            .kind,
        ErrorType::InvalidState
    );
    srq.post_recv(&[server.seg(0, 16)], 100).expect("srq recv");
    srq.post_recv(&[server.seg(16, 16)], 101).expect("srq recv");

    let (_psp, port) = Sp::create_psp_any(&server.ia, &server.cr, 0).expect("psp");
    for (client, ep) in [(&c1, &ep_a), (&c2, &ep_b)] {
        client
            .ep
            .connect(Ipv4Addr::LOCALHOST, port, GUARD_US, b"", 0, 0)
            .expect("connect");
        next_cr(&server.cr).accept(Some(ep), b"").expect("accept");
        assert_eq!(
            next(&client.conn).number,
            event_number::CONNECTION_ESTABLISHED
        );
        assert_eq!(
            next(&server.conn).number,
            event_number::CONNECTION_ESTABLISHED
        );
    }
    c1.buf.write(0, b"from c1");
    c1.ep.post_send(&[c1.seg(0, 7)], 1, 0).expect("send");
    let ev = next(&server.dto);
    let EventData::Dto {
        ep,
        cookie,
        status,
        transferred,
        ..
    } = ev.data
    else {
        panic!("{ev:?}")
    };
    assert_eq!(
        (ep, cookie, status, transferred),
        (ep_a.handle(), 100, dto_status::SUCCESS, 7)
    );
    c2.ep.post_send(&[c2.seg(0, 3)], 1, 0).expect("send");
    let ev = next(&server.dto);
    let EventData::Dto { ep, cookie, .. } = ev.data else {
        panic!("{ev:?}")
    };
    assert_eq!((ep, cookie), (ep_b.handle(), 101));
    assert_eq!(server.buf.read(0, 7), b"from c1");
    close(&[&c1, &c2, &server]);
}

#[test]
fn rsp_dup_connect_and_handoff() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    // A free port, found with a probe PSP; another test's connection may take it between the
    // probe's release and the RSP's bind (its ephemeral port): then try another.
    let (rsp, port) = (0..50)
        .find_map(|_| {
            let (probe, port) =
                Sp::create_psp_any(&server.ia, &server.cr, 0).expect("find a free port");
            probe.free().expect("free probe");
            Sp::create_rsp(&server.ia, port, &server.ep, &server.cr)
                .ok()
                .map(|rsp| (rsp, port))
        })
        .expect("rsp on a free port");
    assert_eq!(server.ep.state(), ep_state::RESERVED);
    client
        .ep
        .connect(Ipv4Addr::LOCALHOST, port, GUARD_US, b"rsp", 0, 0)
        .expect("connect");
    let cr = next_cr(&server.cr);
    assert_eq!(cr.query().ep, server.ep.handle());
    assert_eq!(server.ep.state(), ep_state::TENTATIVE_CONNECTION_PENDING);
    cr.accept(None, b"").expect("accept on the reserved EP");
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_ESTABLISHED
    );
    assert_eq!(
        next(&server.conn).number,
        event_number::CONNECTION_ESTABLISHED
    );
    rsp.free().expect("free rsp");

    // dup_connect goes where the first EP is connected: a PSP there hands the request off.
    let (psp1, port1) = Sp::create_psp_any(&server.ia, &server.cr, 0).expect("psp1");
    let (psp2, port2) = Sp::create_psp_any(&server.ia, &server.cr, 0).expect("psp2");
    let client_b = Ep::create(
        &client.ia,
        Some(client.pz.clone()),
        Some(client.dto.clone()),
        Some(client.dto.clone()),
        Some(client.conn.clone()),
        None,
        None,
    )
    .expect("client ep b");
    let server_b = Ep::create(
        &server.ia,
        Some(server.pz.clone()),
        Some(server.dto.clone()),
        Some(server.dto.clone()),
        Some(server.conn.clone()),
        None,
        None,
    )
    .expect("server ep b");
    client_b
        .connect(Ipv4Addr::LOCALHOST, port1, GUARD_US, b"handoff", 0, 0)
        .expect("connect");
    let cr = next_cr(&server.cr);
    cr.handoff(port2).expect("handoff");
    let ev = next(&server.cr);
    let EventData::CrArrival { cr, sp, .. } = ev.data else {
        panic!("{ev:?}")
    };
    assert_eq!(sp, psp2.handle());
    let cr = handle::cr(cr).expect("cr");
    assert_eq!(&*cr.query().private_data, b"handoff");
    cr.accept(Some(&server_b), b"").expect("accept");
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_ESTABLISHED
    );
    assert_eq!(
        next(&server.conn).number,
        event_number::CONNECTION_ESTABLISHED
    );

    let client_c = Ep::create(
        &client.ia,
        Some(client.pz.clone()),
        None,
        None,
        Some(client.conn.clone()),
        None,
        None,
    )
    .expect("client ep c");
    // client.ep is connected to `port` (the RSP's, now gone): nobody listens there.
    client_c
        .dup_connect(&client.ep, GUARD_US, b"", 0)
        .expect("dup connect");
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_NON_PEER_REJECTED
    );
    let _ = (psp1, psp2);
    close(&[&client, &server]);
}

#[test]
fn graceful_disconnect_lets_outstanding_requests_finish() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    server
        .ep
        .post_recv(&[server.seg(0, 64)], 1, 0)
        .expect("recv");
    client
        .ep
        .post_send(&[client.seg(0, 64)], 2, 0)
        .expect("send");
    client
        .ep
        .post_rdma_write(&[client.seg(0, 64)], 3, server.remote(128, 64), 0)
        .expect("write");
    client
        .ep
        .disconnect(close_flags::GRACEFUL)
        .expect("graceful disconnect");
    assert_eq!(
        dto(&next(&client.dto)),
        (2, dto_status::SUCCESS, 64, dto_op::SEND)
    );
    assert_eq!(
        dto(&next(&client.dto)),
        (3, dto_status::SUCCESS, 64, dto_op::RDMA_WRITE)
    );
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_DISCONNECTED
    );
    assert_eq!(
        next(&server.conn).number,
        event_number::CONNECTION_DISCONNECTED
    );
    assert_eq!(
        dto(&next(&server.dto)),
        (1, dto_status::SUCCESS, 64, dto_op::RECEIVE)
    );
    close(&[&client, &server]);
}

#[test]
fn completions_trigger_the_cno() {
    use crate::core::cno::Cno;
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    let cno = Cno::create(&server.ia, None, (0, 0)).expect("cno");
    server.dto.modify_cno(Some(cno.clone())).expect("attach");
    server
        .ep
        .post_recv(&[server.seg(0, 8)], 1, 0)
        .expect("recv");
    client
        .ep
        .post_send(&[client.seg(0, 8)], 2, 0)
        .expect("send");
    assert_eq!(cno.wait(GUARD_US), Ok(server.dto.handle()));
    assert_eq!(dto(&server.dto.dequeue().expect("the completion")).0, 1);
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
    assert_eq!(client.ep.state(), ep_state::DISCONNECTED);
    close(&[&client]);
    t.join().expect("fake target");
}

#[test]
fn large_transfers_arrive_intact() {
    const BIG: usize = 4 << 20;
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    let sbuf = Buffer::new(BIG);
    let cbuf = Buffer::new(BIG);
    let slmr = server.register(&sbuf);
    let clmr = client.register(&cbuf);
    let pattern: Vec<u8> = (0..BIG).map(|i| (i * 7 + i / 4096) as u8).collect();
    sbuf.write(0, &pattern);
    let remote = RemoteBuffer {
        address: sbuf.addr(),
        length: BIG as u32,
        rmr_context: slmr.rmr_context(),
    };
    let local = Sge {
        addr: cbuf.addr(),
        length: BIG as u32,
        lkey: clmr.lmr_context(),
    };

    client
        .ep
        .post_rdma_read(&[local], 1, remote, 0)
        .expect("big read");
    assert_eq!(
        dto(&next(&client.dto)),
        (1, dto_status::SUCCESS, BIG as u32, dto_op::RDMA_READ)
    );
    assert!(cbuf.read(0, BIG) == pattern, "read data differs");

    let reversed: Vec<u8> = pattern.iter().rev().copied().collect();
    cbuf.write(0, &reversed);
    for i in 0..4u64 {
        client
            .ep
            .post_rdma_write(&[local], 10 + i, remote, 0)
            .expect("big write");
    }
    for i in 0..4u64 {
        assert_eq!(
            dto(&next(&client.dto)),
            (10 + i, dto_status::SUCCESS, BIG as u32, dto_op::RDMA_WRITE)
        );
    }
    assert!(sbuf.read(0, BIG) == reversed, "written data differs");

    server
        .ep
        .post_recv(
            &[Sge {
                addr: sbuf.addr(),
                length: (1 << 20) as u32,
                lkey: slmr.lmr_context(),
            }],
            20,
            0,
        )
        .expect("recv");
    client
        .ep
        .post_send(
            &[Sge {
                addr: cbuf.addr(),
                length: (1 << 20) as u32,
                lkey: clmr.lmr_context(),
            }],
            21,
            0,
        )
        .expect("big send");
    assert_eq!(
        dto(&next(&server.dto)),
        (20, dto_status::SUCCESS, 1 << 20, dto_op::RECEIVE)
    );
    assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);
    assert!(
        sbuf.read(0, 1 << 20) == reversed[..1 << 20],
        "sent data differs"
    );
    close(&[&client, &server]);
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
fn provider_created_ep_is_configured_then_accepted() {
    use crate::core::ep::EpModify;
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let (_psp, port) = Sp::create_psp_any(
        &server.ia,
        &server.cr,
        crate::core::consts::psp_flags::PROVIDER,
    )
    .expect("psp");
    client
        .ep
        .connect(Ipv4Addr::LOCALHOST, port, GUARD_US, b"", 0, 0)
        .expect("connect");
    let cr = next_cr(&server.cr);
    let ep = handle::ep(cr.query().ep).expect("provider-created EP");
    assert_eq!(ep.state(), ep_state::UNCONFIGURED_TENTATIVE);
    let e = cr.accept(None, b"").expect_err("unconfigured");
    assert_eq!(
        (e.kind, e.sub),
        (ErrorType::InvalidState, SubType::EpUnconfTentative)
    );
    ep.modify(EpModify {
        pz: Some(server.pz.clone()),
        recv_evd: Some(Some(server.dto.clone())),
        request_evd: Some(Some(server.dto.clone())),
        connect_evd: Some(Some(server.conn.clone())),
        attr: None,
    })
    .expect("configure");
    assert_eq!(ep.state(), ep_state::TENTATIVE_CONNECTION_PENDING);
    cr.accept(None, b"").expect("accept");
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_ESTABLISHED
    );
    assert_eq!(
        next(&server.conn).number,
        event_number::CONNECTION_ESTABLISHED
    );
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
    assert_eq!(client.ep.state(), ep_state::DISCONNECTED);
    assert_eq!(
        dto(&next(&client.dto)),
        (4, dto_status::FLUSHED, 0, dto_op::RECEIVE)
    );
    close(&[&client]);
    t.join().expect("silent peer");
}

#[test]
fn abrupt_disconnect_flushes_at_once() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    client
        .ep
        .post_recv(&[client.seg(0, 8)], 1, 0)
        .expect("recv");
    client
        .ep
        .disconnect(close_flags::ABRUPT)
        .expect("abrupt disconnect");
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_DISCONNECTED
    );
    assert_eq!(
        dto(&next(&client.dto)),
        (1, dto_status::FLUSHED, 0, dto_op::RECEIVE)
    );
    let ev = next(&server.conn).number;
    assert!(matches!(
        ev,
        event_number::CONNECTION_DISCONNECTED | event_number::CONNECTION_BROKEN
    ));
    close(&[&client, &server]);
}

#[test]
fn an_overflowing_evd_keeps_every_completion_and_reports_once() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    let small = Evd::create(&client.ia, 2, None, evd_flags::DTO).expect("small evd");
    let ep = Ep::create(
        &client.ia,
        Some(client.pz.clone()),
        Some(small.clone()),
        Some(small.clone()),
        Some(client.conn.clone()),
        None,
        None,
    )
    .expect("ep");
    for i in 0..4u64 {
        ep.post_recv(&[client.seg(0, 8)], i, 0).expect("recv");
    }
    ep.free()
        .expect("free: flushes four receives into a queue of two");
    let mut cookies: Vec<u64> = (0..4)
        .map(|_| dto(&small.dequeue().expect("kept")).0)
        .collect();
    cookies.sort();
    assert_eq!(cookies, vec![0, 1, 2, 3]);
    let async_evd = client.ia.async_evd().expect("async evd");
    assert_eq!(next(&async_evd).number, event_number::ASYNC_EVD_OVERFLOW);
    assert_eq!(
        async_evd.dequeue().expect_err("reported once").kind,
        ErrorType::QueueEmpty
    );
    close(&[&client, &server]);
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
    use super::super::{
        access, CmEvent, Device, QpCap, QpInit, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
    };
    use super::wire::{self, Header, Kind, Status};
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

/// DAT_COMPLETION_BARRIER_FENCE_FLAG: a send or RDMA write fenced behind an RDMA read into its
/// source buffer carries what the read brought, not what was there when it was posted; and
/// what is posted after a waiting request waits behind it (completions stay in post order).
#[test]
fn fenced_requests_wait_for_earlier_reads() {
    use crate::core::consts::completion_flags;
    const BIG: usize = 4 << 20;
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    let sbuf = Buffer::new(BIG);
    let cbuf = Buffer::new(BIG);
    let slmr = server.register(&sbuf);
    let clmr = client.register(&cbuf);
    let pattern: Vec<u8> = (0..BIG).map(|i| (i * 13 + i / 977) as u8 | 1).collect();
    sbuf.write(0, &pattern);
    let cseg = |off: usize, len: usize| Sge {
        addr: cbuf.addr() + off as u64,
        length: len as u32,
        lkey: clmr.lmr_context(),
    };
    server
        .ep
        .post_recv(&[server.seg(0, 64)], 100, 0)
        .expect("recv");
    server
        .ep
        .post_recv(&[server.seg(64, 64)], 101, 0)
        .expect("recv");
    let tail = BIG - 48;
    client
        .ep
        .post_rdma_read(
            &[cseg(0, BIG)],
            1,
            RemoteBuffer {
                address: sbuf.addr(),
                length: BIG as u32,
                rmr_context: slmr.rmr_context(),
            },
            0,
        )
        .expect("read");
    client
        .ep
        .post_send(&[cseg(tail, 16)], 2, completion_flags::BARRIER_FENCE)
        .expect("fenced send");
    client
        .ep
        .post_rdma_write(
            &[cseg(tail + 16, 16)],
            3,
            server.remote(1000, 16),
            completion_flags::BARRIER_FENCE,
        )
        .expect("fenced write");
    // Not fenced, but posted behind fenced requests: also sends what the read brought.
    client
        .ep
        .post_send(&[cseg(tail + 32, 16)], 4, 0)
        .expect("send behind them");
    let order: Vec<(u64, u32, u32)> = (0..4)
        .map(|_| {
            let (cookie, status, transferred, _) = dto(&next(&client.dto));
            (cookie, status, transferred)
        })
        .collect();
    assert_eq!(
        order,
        vec![
            (1, dto_status::SUCCESS, BIG as u32),
            (2, dto_status::SUCCESS, 16),
            (3, dto_status::SUCCESS, 16),
            (4, dto_status::SUCCESS, 16),
        ]
    );
    assert_eq!(dto(&next(&server.dto)).0, 100);
    assert_eq!(dto(&next(&server.dto)).0, 101);
    assert_eq!(
        server.buf.read(0, 16),
        pattern[tail..tail + 16],
        "fenced send"
    );
    assert_eq!(
        server.buf.read(1000, 16),
        pattern[tail + 16..tail + 32],
        "fenced write"
    );
    assert_eq!(
        server.buf.read(64, 16),
        pattern[tail + 32..tail + 48],
        "send posted behind a fence"
    );
    close(&[&client, &server]);
}

/// dat_rmr_bind on a DISCONNECTED EP: the post succeeds and is flushed at once to the request
/// EVD, on the caller's thread (no deadlock), and the flushed bind leaves the RMR unbound (its
/// LMR no longer in use).
#[test]
fn rmr_bind_on_a_disconnected_ep_is_flushed_and_leaves_it_unbound() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    let rmr = Rmr::create(&client.pz).expect("rmr");
    let triplet = (client.buf.addr() + 512, 64, client.lmr.lmr_context());
    let ctx = rmr
        .bind(
            Some(&client.lmr),
            triplet,
            mem_priv::REMOTE_READ,
            VA_TYPE_VA,
            &client.ep,
            1,
            0,
        )
        .expect("bind while connected");
    assert_eq!(
        next(&client.dto).data,
        EventData::RmrBind {
            rmr: rmr.handle(),
            cookie: 1,
            status: dto_status::SUCCESS
        }
    );
    assert_eq!(rmr.query().rmr_context, ctx);
    client
        .ep
        .disconnect(close_flags::GRACEFUL)
        .expect("disconnect");
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_DISCONNECTED
    );
    assert_eq!(client.ep.state(), ep_state::DISCONNECTED);

    // On a helper thread, so that a deadlock fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (rmr, lmr, ep) = (rmr.clone(), client.lmr.clone(), client.ep.clone());
        std::thread::spawn(move || {
            let r = rmr.bind(
                Some(&lmr),
                triplet,
                mem_priv::REMOTE_READ,
                VA_TYPE_VA,
                &ep,
                2,
                0,
            );
            let _ = tx.send(r.map_err(|e| e.kind));
        });
    }
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("dat_rmr_bind on a DISCONNECTED EP returns (no deadlock)");
    assert!(r.is_ok(), "the post succeeds: {r:?}");
    let ev = client.dto.dequeue().expect("flushed at once");
    assert_eq!(
        ev.data,
        EventData::RmrBind {
            rmr: rmr.handle(),
            cookie: 2,
            status: dto_status::FLUSHED
        }
    );
    assert_eq!(
        client.dto.dequeue().expect_err("one event").kind,
        ErrorType::QueueEmpty
    );
    let q = rmr.query();
    assert_eq!((q.lmr, q.lmr_triplet), (Handle::NULL, (0, 0, 0)), "unbound");
    rmr.free().expect("free rmr");
    client.lmr.free().expect("the LMR is no longer bound");
    close(&[&client, &server]);
}

/// Waits until a thread is in `evd.wait` (readiness by polling the flag; the hang guard bounds
/// it).
fn until_waiting(evd: &Evd) {
    let end = std::time::Instant::now() + std::time::Duration::from_micros(u64::from(GUARD_US));
    while !evd.has_waiter() {
        assert!(std::time::Instant::now() < end, "no waiter");
        std::thread::yield_now();
    }
}

/// A thread waiting on an EVD runs the transport for its connections itself (`drive`): what
/// arrives completes there, large payloads included; output another thread queues on those
/// connections still goes out; and software events and dat_evd_set_unwaitable still reach it.
#[test]
fn a_waiting_thread_drives_its_connections() {
    use crate::core::error::DatError;
    const BIG: usize = 4 << 20;
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    let sbuf = Buffer::new(BIG);
    let cbuf = Buffer::new(BIG);
    let slmr = server.register(&sbuf);
    let clmr = client.register(&cbuf);
    let pattern: Vec<u8> = (0..BIG).map(|i| (i * 31 + i / 4099) as u8).collect();
    let sseg = Sge {
        addr: sbuf.addr(),
        length: BIG as u32,
        lkey: slmr.lmr_context(),
    };
    let cseg = Sge {
        addr: cbuf.addr(),
        length: BIG as u32,
        lkey: clmr.lmr_context(),
    };
    let waiter = |evd: &Arc<Evd>| {
        let evd = evd.clone();
        std::thread::spawn(move || evd.wait(GUARD_US, 1).map(|(ev, _)| ev).map_err(|e| e.kind))
    };

    // A receive completing in the waiting thread, the 4 MiB arriving through it.
    cbuf.write(0, &pattern);
    server.ep.post_recv(&[sseg], 7, 0).expect("recv");
    let t = waiter(&server.dto);
    until_waiting(&server.dto);
    client.ep.post_send(&[cseg], 8, 0).expect("send");
    let ev = t.join().expect("waiter").expect("receive completion");
    assert_eq!(
        dto(&ev),
        (7, dto_status::SUCCESS, BIG as u32, dto_op::RECEIVE)
    );
    assert!(sbuf.read(0, BIG) == pattern, "received data differs");
    assert_eq!(dto(&next(&client.dto)).0, 8);

    // Output queued by this thread on a connection the waiter drives.
    let reversed: Vec<u8> = pattern.iter().rev().copied().collect();
    sbuf.write(0, &reversed);
    let t = waiter(&server.dto);
    until_waiting(&server.dto);
    server
        .ep
        .post_rdma_write(
            &[sseg],
            9,
            RemoteBuffer {
                address: cbuf.addr(),
                length: BIG as u32,
                rmr_context: clmr.rmr_context(),
            },
            0,
        )
        .expect("write");
    let ev = t.join().expect("waiter").expect("write completion");
    assert_eq!(
        dto(&ev),
        (9, dto_status::SUCCESS, BIG as u32, dto_op::RDMA_WRITE)
    );
    assert!(cbuf.read(0, BIG) == reversed, "written data differs");

    // Events that do not come from the transport.
    let t = waiter(&server.dto);
    until_waiting(&server.dto);
    server.dto.post_se(0x5e).expect("post_se");
    let ev = t.join().expect("waiter").expect("software event");
    assert_eq!(ev.data, EventData::Software { pointer: 0x5e });
    let t = waiter(&server.dto);
    until_waiting(&server.dto);
    server.dto.set_waitable(false);
    assert_eq!(
        t.join().expect("waiter").expect_err("unwaitable"),
        DatError::invalid_state(SubType::EvdUnwaitable).kind
    );
    server.dto.set_waitable(true);
    close(&[&client, &server]);
}

/// The connections a wait claimed go back to the progress thread when it ends, into its set
/// of returned connections (`Engine::release_cq_claims`): an RDMA read the peer posts right
/// after the target's last wait, with nobody on the target waiting again, is served there;
/// and so is one posted while the target waits on an EVD its connection does not complete
/// into (its wait claims nothing). Over TCP (the same-host path would copy on the posting
/// thread, and its rings keep a connection out of that set).
#[test]
fn a_connection_a_wait_claimed_is_served_after_the_wait() {
    use super::samehost::{test_hooks, Mode};
    let ((server, client), _) = test_hooks::open_with(Mode::Never, || {
        (
            Side::new("srv", mem_priv::ALL),
            Side::new("cli", mem_priv::ALL),
        )
    });
    let _psp = connect_pair(&server, &client);
    let read = |id: u64| {
        read_8_bytes(
            &client,
            id,
            server.buf.addr() + 64,
            server.lmr.rmr_context(),
        )
    };
    for round in 0..3u8 {
        // A wait on the server that its connection completes into, ended by a receive.
        server
            .ep
            .post_recv(&[server.seg(0, 8)], 10 + u64::from(round), 0)
            .expect("recv");
        let evd = server.dto.clone();
        let waiter = std::thread::spawn(move || evd.wait(GUARD_US, 1).map(|(ev, _)| ev));
        until_waiting(&server.dto);
        client.buf.write(0, &[round; 8]);
        client
            .ep
            .post_send(&[client.seg(0, 8)], 20 + u64::from(round), 0)
            .expect("send");
        let ev = waiter.join().expect("waiter").expect("receive");
        assert_eq!(dto(&ev).0, 10 + u64::from(round));
        assert_eq!(dto(&next(&client.dto)).0, 20 + u64::from(round));

        // Nobody on the server waits now: its progress thread must serve the read.
        server.buf.write(64, &[0xa0 + round; 8]);
        // In the last round the server waits, on an EVD of no connection.
        let other = (round == 2).then(|| {
            let other = Evd::create(&server.ia, 4, None, evd_flags::DTO).expect("evd");
            let w = other.clone();
            let t = std::thread::spawn(move || w.wait(GUARD_US, 1).map(|_| ()));
            until_waiting(&other);
            (other, t)
        });
        read(30 + u64::from(round));
        assert_eq!(
            dto(&next(&client.dto)),
            (
                30 + u64::from(round),
                dto_status::SUCCESS,
                8,
                dto_op::RDMA_READ
            )
        );
        if let Some((other, t)) = other {
            other.post_se(0).expect("end the other wait");
            t.join().expect("other waiter").expect("software event");
        }
        assert_eq!(client.buf.read(0, 8), vec![0xa0 + round; 8]);
    }
    close(&[&client, &server]);
}

/// Many large RDMA reads in flight, behind a send that waits for its receive: the target
/// answers each straight from registered memory once the answers before it have drained, in
/// order; the initiator places each answer straight into its buffer.
#[test]
fn many_large_reads_in_flight_complete_in_order() {
    const MIB: usize = 1 << 20;
    const READS: usize = 12;
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    let sbuf = Buffer::new(4 * MIB);
    let cbuf = Buffer::new(READS * MIB);
    let slmr = server.register(&sbuf);
    let clmr = client.register(&cbuf);
    let pattern: Vec<u8> = (0..4 * MIB).map(|i| (i * 7 + i / 65_537) as u8).collect();
    sbuf.write(0, &pattern);
    client.buf.write(0, b"first!");
    client
        .ep
        .post_send(&[client.seg(0, 6)], 100, 0)
        .expect("send");
    for i in 0..READS {
        let from = (i % 4) * MIB;
        client
            .ep
            .post_rdma_read(
                &[Sge {
                    addr: cbuf.addr() + (i * MIB) as u64,
                    length: MIB as u32,
                    lkey: clmr.lmr_context(),
                }],
                i as u64,
                RemoteBuffer {
                    address: sbuf.addr() + from as u64,
                    length: MIB as u32,
                    rmr_context: slmr.rmr_context(),
                },
                0,
            )
            .expect("read");
    }
    server
        .ep
        .post_recv(&[server.seg(0, 64)], 200, 0)
        .expect("recv");
    assert_eq!(
        dto(&next(&client.dto)),
        (100, dto_status::SUCCESS, 6, dto_op::SEND)
    );
    for i in 0..READS {
        assert_eq!(
            dto(&next(&client.dto)),
            (i as u64, dto_status::SUCCESS, MIB as u32, dto_op::RDMA_READ)
        );
        let from = (i % 4) * MIB;
        assert!(
            cbuf.read(i * MIB, MIB) == pattern[from..from + MIB],
            "read {i} differs"
        );
    }
    assert_eq!(
        dto(&next(&server.dto)),
        (200, dto_status::SUCCESS, 6, dto_op::RECEIVE)
    );
    assert_eq!(server.buf.read(0, 6), b"first!");
    close(&[&client, &server]);
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
    use crate::backend::Device;
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

/// A polling consumer (dat_evd_dequeue) reads its connections itself (`TcpCq::progress`);
/// once it stops polling, the progress thread must still serve them: here the server
/// application calls nothing after its polling, and the client's second send can complete
/// only once the server's side has read it. (A lease that kept the progress thread off polled
/// connections for a while was tried and dropped: see `progress_loop`.)
#[test]
fn a_polling_consumer_hands_its_connections_back_when_it_stops() {
    let server = Side::new("srv", mem_priv::ALL);
    let client = Side::new("cli", mem_priv::ALL);
    server
        .ep
        .post_recv(&[server.seg(0, 8)], 1, 0)
        .expect("recv");
    server
        .ep
        .post_recv(&[server.seg(8, 8)], 2, 0)
        .expect("recv");
    let _psp = connect_pair(&server, &client);

    client
        .ep
        .post_send(&[client.seg(0, 8)], 11, 0)
        .expect("send");
    let guard = std::time::Instant::now() + std::time::Duration::from_micros(GUARD_US as u64);
    let first = loop {
        match server.dto.dequeue() {
            Ok(ev) => break ev,
            Err(e) => assert_eq!(e.kind, ErrorType::QueueEmpty),
        }
        assert!(
            std::time::Instant::now() < guard,
            "no receive before the hang guard"
        );
        std::thread::yield_now();
    };
    assert_eq!(dto(&first), (1, dto_status::SUCCESS, 8, dto_op::RECEIVE));
    assert_eq!(
        dto(&next(&client.dto)),
        (11, dto_status::SUCCESS, 8, dto_op::SEND)
    );

    // The server no longer polls: its progress thread takes the connection back.
    client
        .ep
        .post_send(&[client.seg(8, 8)], 12, 0)
        .expect("send");
    assert_eq!(
        dto(&next(&client.dto)),
        (12, dto_status::SUCCESS, 8, dto_op::SEND)
    );
    assert_eq!(
        dto(&next(&server.dto)),
        (2, dto_status::SUCCESS, 8, dto_op::RECEIVE)
    );
    close(&[&client, &server]);
}

#[test]
fn spin_window_setting() {
    use super::engine::parse_spin;
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
    use super::super::{CmEvent, Device};
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
mod ud;
