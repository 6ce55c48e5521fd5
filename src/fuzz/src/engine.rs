//! The engine under fuzzed frames, through real loopback sockets, from both ends:
//!
//! * [`EngineTarget`]: a live IA listens on a PSP; each input is what a peer sends it: the
//!   first frame (a HELLO, or not), then, once the harness accepted the request, the rest
//!   (SEND, WRITE, READ_REQ, WRITE_IMM, ATOMIC, ... in any order, with any field values).
//! * [`EngineInitiator`]: a live IA connects to a fake target; each input is what the target
//!   answers: the reply to the HELLO (ACCEPT, REJECT, or not), then, once the EP posted a send,
//!   an RDMA write, an RDMA read and a large one (its answer received straight into the
//!   read's buffer), the answers (ACK, READ_RESP, ...).
//!
//! Checked for every input: no panic, no hang (every wait has a generous limit and panics
//! past it), the engine agrees with the decoder on whether the handshake frame is one, what
//! the target sends back decodes, the connection ends with one connection event, every
//! posted DTO completes exactly once, and the target's memory outside the region it exposed
//! is never written.
//!
//! Frames whose key is [`KEY_MARK`] get the live rmr_context instead, and their address, when
//! below 4096, is taken as an offset in the exposed buffer: so corpus inputs reach real memory
//! whatever context the IA hands out.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::class_of;
use crate::wire::LIMITS;
use daplrs::backend::tcp::wire::{self, Decoder, Header, Kind, HEADER_LEN};
use daplrs::backend::Sge;
use daplrs::core::consts::{close_flags, evd_flags, event_number, mem_priv};
use daplrs::core::cr::Cr;
use daplrs::core::ep::{Ep, RemoteBuffer};
use daplrs::core::evd::{Evd, EventData};
use daplrs::core::handle;
use daplrs::core::ia::Ia;
use daplrs::core::lmr::{Lmr, LmrRegion, VA_TYPE_VA};
use daplrs::core::pz::Pz;
use daplrs::core::sp::Sp;
use daplrs::device::open_device;

/// A key the harness replaces with the live rmr_context.
pub const KEY_MARK: u32 = 0xfeed_0001;
/// Hang guard: far beyond anything a loaded machine needs.
const GUARD: Duration = Duration::from_secs(20);
const GUARD_US: u32 = 20_000_000;
const BUF_LEN: usize = 4096;
/// The local buffer (receives, sends, read targets): room for a read large enough that its
/// answer is received straight into it (wire::DIRECT_READ_MIN).
const LOCAL_LEN: usize = 80 << 10;
/// The initiator's large read: its answer goes through the direct-read path.
pub const BIG_READ: u32 = 64 << 10;
/// The part of the target's buffer its LMR exposes; the rest must never change.
const EXPOSED: std::ops::Range<usize> = 1024..3072;
const CANARY: u8 = 0xa5;
const RECVS: u64 = 4;

/// Memory the transport writes behind Rust's back: touched only through its raw pointer.
struct Buffer {
    _mem: Box<[u8]>,
    ptr: *mut u8,
}

// SAFETY: the buffer is plain memory; the harness reads it only between inputs, when no
// transfer into it is in flight.
unsafe impl Send for Buffer {}

impl Buffer {
    fn new(len: usize, fill: u8) -> Buffer {
        let mut mem = vec![fill; len].into_boxed_slice();
        let ptr = mem.as_mut_ptr();
        Buffer { _mem: mem, ptr }
    }
    fn addr(&self) -> u64 {
        self.ptr as u64
    }
    fn byte(&self, i: usize) -> u8 {
        assert!(i < BUF_LEN);
        // SAFETY: in bounds of our allocation.
        unsafe { self.ptr.add(i).read_volatile() }
    }
}

struct Rig {
    ia: Arc<Ia>,
    pz: Arc<Pz>,
    dto: Arc<Evd>,
    conn: Arc<Evd>,
    cr: Arc<Evd>,
    local: Buffer,
    local_lmr: Arc<Lmr>,
    exposed: Buffer,
    exposed_lmr: Arc<Lmr>,
}

impl Rig {
    fn new(name: &str) -> Rig {
        let (ia, _) =
            Ia::open(name, "tcp 127.0.0.1", open_device, Some(64), 0).expect("open IA on loopback");
        let pz = Pz::create(&ia).expect("pz");
        let dto = Evd::create(&ia, 256, None, evd_flags::DTO | evd_flags::RMR_BIND).expect("evd");
        let conn = Evd::create(&ia, 64, None, evd_flags::CONNECTION).expect("evd");
        let cr = Evd::create(&ia, 64, None, evd_flags::CR).expect("evd");
        let local = Buffer::new(LOCAL_LEN, 0);
        let local_lmr = Lmr::create(
            &ia,
            LmrRegion::Virtual {
                address: local.addr(),
                length: LOCAL_LEN as u64,
            },
            &pz,
            mem_priv::ALL,
            VA_TYPE_VA,
        )
        .expect("lmr");
        let exposed = Buffer::new(BUF_LEN, CANARY);
        let exposed_lmr = Lmr::create(
            &ia,
            LmrRegion::Virtual {
                address: exposed.addr() + EXPOSED.start as u64,
                length: EXPOSED.len() as u64,
            },
            &pz,
            mem_priv::KNOWN,
            VA_TYPE_VA,
        )
        .expect("lmr");
        Rig {
            ia,
            pz,
            dto,
            conn,
            cr,
            local,
            local_lmr,
            exposed,
            exposed_lmr,
        }
    }

    fn ep(&self) -> Arc<Ep> {
        Ep::create(
            &self.ia,
            Some(self.pz.clone()),
            Some(self.dto.clone()),
            Some(self.dto.clone()),
            Some(self.conn.clone()),
            None,
            None,
        )
        .expect("ep")
    }

    fn seg(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.local.addr() + off as u64,
            length: len,
            lkey: self.local_lmr.lmr_context(),
        }
    }

    /// Splits a peer's byte stream into frames as their headers declare (a short or
    /// over-long last one is kept as it is), substituting [`KEY_MARK`] as described above.
    fn frames(&self, data: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < data.len() {
            let rest = &data[pos..];
            if rest.len() < HEADER_LEN {
                out.push(rest.to_vec());
                break;
            }
            let plen = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
            let end = HEADER_LEN.saturating_add(plen).min(rest.len());
            let mut f = rest[..end].to_vec();
            let flags = u16::from_le_bytes([f[2], f[3]]);
            let keyed = matches!(f[0], 5 | 6 | 10 | 11)
                || (f[0] == 4 && flags & wire::FLAG_INVALIDATE != 0);
            if keyed && f[16..20] == KEY_MARK.to_le_bytes() {
                f[16..20].copy_from_slice(&self.exposed_lmr.rmr_context().to_le_bytes());
                let addr = u64::from_le_bytes(f[8..16].try_into().expect("8 bytes"));
                if addr < BUF_LEN as u64 {
                    f[8..16].copy_from_slice(&(self.exposed.addr() + addr).to_le_bytes());
                }
            }
            out.push(f);
            pos += end;
        }
        out
    }

    /// Waits for the connection event that ends a connection.
    fn wait_end(&self) -> u32 {
        loop {
            let (ev, _) = self
                .conn
                .wait(GUARD_US, 1)
                .expect("hang: the connection never ended");
            if ev.number != event_number::CONNECTION_ESTABLISHED {
                return ev.number;
            }
        }
    }

    /// Waits until each of `cookies` completed, and checks none completes twice.
    fn wait_dtos(&self, cookies: &[u64]) -> Vec<u32> {
        let mut seen = HashSet::new();
        let mut statuses = Vec::new();
        while seen.len() < cookies.len() {
            let (ev, _) = self
                .dto
                .wait(GUARD_US, 1)
                .expect("hang: a posted DTO never completed");
            if let EventData::Dto { cookie, status, .. } = ev.data {
                assert!(cookies.contains(&cookie), "completion of unknown {cookie}");
                assert!(seen.insert(cookie), "DTO {cookie} completed twice");
                statuses.push(status);
            }
        }
        statuses
    }

    /// After an input: nothing left over, nothing outside the exposed region written.
    fn settle(&self, ep: &Arc<Ep>) {
        ep.free().expect("free EP");
        if let Ok(ev) = self.dto.dequeue() {
            panic!("completion after every DTO completed: {:?}", ev.data);
        }
        while self.conn.dequeue().is_ok() {}
        while let Ok(ev) = self.cr.dequeue() {
            if let EventData::CrArrival { cr, .. } = ev.data {
                if let Ok(cr) = handle::cr(cr) {
                    let _ = cr.reject(b"");
                }
            }
        }
        for i in (0..BUF_LEN).filter(|i| !EXPOSED.contains(i)) {
            assert_eq!(
                self.exposed.byte(i),
                CANARY,
                "byte {i} outside the exposed region was written"
            );
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.ia.close(close_flags::ABRUPT);
    }
}

/// Whether `f` is a whole frame of `kind` our decoder accepts.
fn is_complete(f: &[u8], kind: Kind) -> bool {
    if f.len() < HEADER_LEN {
        return false;
    }
    let hb: [u8; HEADER_LEN] = f[..HEADER_LEN].try_into().expect("32 bytes");
    match Header::decode(&hb, &LIMITS) {
        Ok(h) => h.kind == kind && f.len() == HEADER_LEN + h.payload_len as usize,
        Err(_) => false,
    }
}

fn stream_with_guard(s: TcpStream) -> TcpStream {
    s.set_read_timeout(Some(GUARD)).expect("read timeout");
    s.set_write_timeout(Some(GUARD)).expect("write timeout");
    s
}

/// Reads one frame; None if the stream ended or broke first.
fn read_frame(s: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).ok()?;
    let h = Header::decode(&hb, &LIMITS).expect("our own engine sent a bad header");
    let mut p = vec![0u8; h.payload_len as usize];
    s.read_exact(&mut p).ok()?;
    Some((h, p))
}

/// Reads to the end of stream (a timeout is a hang); returns what came.
fn read_to_end(s: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return all,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("hang: the engine never closed the connection")
            }
            Err(_) => return all, // reset: also an end
        }
    }
}

/// The target side: a live IA whose PSP fuzzed peers connect to.
pub struct EngineTarget {
    rig: Rig,
    _psp: Arc<Sp>,
    port: u16,
}

impl Default for EngineTarget {
    fn default() -> Self {
        Self::new()
    }
}

impl EngineTarget {
    pub fn new() -> EngineTarget {
        let rig = Rig::new("fuzz-target");
        let (psp, port) = Sp::create_psp_any(&rig.ia, &rig.cr, 0).expect("psp");
        EngineTarget {
            rig,
            _psp: psp,
            port: port as u16,
        }
    }

    /// One peer: connects, sends the input's first frame, and if that was a HELLO, the rest
    /// once the request was accepted.
    pub fn run(&mut self, data: &[u8]) -> u64 {
        let rig = &self.rig;
        let ep = rig.ep();
        let frames = rig.frames(data);
        let mut s = stream_with_guard(
            // Reusable, like our own connections: thousands of peers must not leave ports that
            // other programs listen on (dtest's 45248) in a TIME_WAIT that blocks them.
            daplrs::fuzzing::connect_reusable(
                std::net::SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port),
                Duration::from_secs(10),
            )
            .expect("connect to the PSP"),
        );
        let first = frames.first().cloned().unwrap_or_default();
        let _ = s.write_all(&first);
        let mut accepted = false;
        let mut cookies = Vec::new();
        if is_complete(&first, Kind::Hello) {
            let (ev, _) = rig
                .cr
                .wait(GUARD_US, 1)
                .expect("hang: a valid HELLO gave no connection request");
            let EventData::CrArrival { cr, .. } = ev.data else {
                panic!("not a connection request: {:?}", ev.data)
            };
            let cr: Arc<Cr> = handle::cr(cr).expect("live CR");
            assert_eq!(
                &*cr.private_data(),
                &first[HEADER_LEN..],
                "the request's private data is not the HELLO's"
            );
            accepted = cr.accept(Some(&ep), b"fuzz-accept").is_ok();
            if accepted {
                let (h, _) = read_frame(&mut s).expect("the ACCEPT");
                assert_eq!(h.kind, Kind::Accept);
                for i in 0..RECVS {
                    ep.post_recv(&[rig.seg(i as usize * 256, 256)], 100 + i, 0)
                        .expect("post recv");
                    cookies.push(100 + i);
                }
                for f in &frames[1..] {
                    if s.write_all(f).is_err() {
                        break;
                    }
                }
            } else {
                let _ = cr.reject(b"");
            }
        }
        let _ = s.shutdown(Shutdown::Write);
        let answers = read_to_end(&mut s);
        // Everything the target sent is well formed.
        let mut d = Decoder::new();
        d.feed(&answers);
        let mut kinds = Vec::new();
        while let Some((h, _)) = d.next_frame(&LIMITS).expect("the target sent a bad frame") {
            kinds.push(h.kind as u8);
        }
        let end = if accepted { rig.wait_end() } else { 0 };
        let statuses = rig.wait_dtos(&cookies);
        rig.settle(&ep);
        if std::env::var_os("DAT_FUZZ_DEBUG").is_some() {
            eprintln!(
                "target: accepted {accepted} end {end:#x} answers {kinds:?} dtos {statuses:?}"
            );
        }
        class_of((accepted, end, kinds, statuses))
    }
}

impl Drop for EngineTarget {
    fn drop(&mut self) {
        let _ = self._psp.free();
    }
}

/// The initiator side: a live IA connecting to a fake target that answers with the input.
pub struct EngineInitiator {
    rig: Rig,
    listener: TcpListener,
}

impl Default for EngineInitiator {
    fn default() -> Self {
        Self::new()
    }
}

impl EngineInitiator {
    pub fn new() -> EngineInitiator {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        EngineInitiator {
            rig: Rig::new("fuzz-initiator"),
            listener,
        }
    }

    fn accept(&self) -> TcpStream {
        let until = Instant::now() + GUARD;
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).expect("blocking");
                    return stream_with_guard(s);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < until, "hang: the EP never connected");
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    }

    /// One connection: the EP connects, the fake target answers the HELLO with the input's
    /// first frame; if that was an ACCEPT, the EP posts a send, an RDMA write, an RDMA read
    /// and a large one, and the target sends the rest.
    pub fn run(&mut self, data: &[u8]) -> u64 {
        let rig = &self.rig;
        let ep = rig.ep();
        let frames = rig.frames(data);
        let mut cookies = vec![1, 2];
        for c in &cookies {
            ep.post_recv(&[rig.seg(*c as usize * 256, 256)], *c, 0)
                .expect("post recv");
        }
        let port = self.listener.local_addr().expect("addr").port();
        ep.connect(
            Ipv4Addr::LOCALHOST,
            u64::from(port),
            GUARD_US,
            b"fuzz",
            0,
            0,
        )
        .expect("connect");
        let mut s = self.accept();
        let (hello, pd) = read_frame(&mut s).expect("the HELLO");
        assert_eq!((hello.kind, &pd[..]), (Kind::Hello, &b"fuzz"[..]));
        let first = frames.first().cloned().unwrap_or_default();
        let _ = s.write_all(&first);
        let established = is_complete(&first, Kind::Accept);
        if established {
            let (ev, _) = rig
                .conn
                .wait(GUARD_US, 1)
                .expect("hang: a valid ACCEPT did not establish");
            assert_eq!(ev.number, event_number::CONNECTION_ESTABLISHED);
            let EventData::Connection { private_data, .. } = ev.data else {
                panic!("no private data: {:?}", ev.data)
            };
            assert_eq!(
                &*private_data,
                &first[HEADER_LEN..],
                "the connection's private data is not the ACCEPT's"
            );
            let remote = RemoteBuffer {
                address: 0x1000,
                length: 64,
                rmr_context: 7,
            };
            ep.post_send(&[rig.seg(1024, 32)], 3, 0).expect("send");
            ep.post_rdma_write(&[rig.seg(1100, 16)], 4, remote, 0)
                .expect("write");
            ep.post_rdma_read(&[rig.seg(1200, 64)], 5, remote, 0)
                .expect("read");
            let big = RemoteBuffer {
                length: BIG_READ,
                ..remote
            };
            ep.post_rdma_read(&[rig.seg(4096, BIG_READ)], 6, big, 0)
                .expect("large read");
            cookies.extend([3, 4, 5, 6]);
            for f in &frames[1..] {
                if s.write_all(f).is_err() {
                    break;
                }
            }
        }
        let _ = s.shutdown(Shutdown::Write);
        let sent = read_to_end(&mut s);
        let (ev, _) = rig
            .conn
            .wait(GUARD_US, 1)
            .expect("hang: the connection never ended");
        let end = ev.number;
        assert_ne!(
            end,
            event_number::CONNECTION_ESTABLISHED,
            "established on what the decoder refuses"
        );
        let statuses = rig.wait_dtos(&cookies);
        rig.settle(&ep);
        if std::env::var_os("DAT_FUZZ_DEBUG").is_some() {
            eprintln!("initiator: established {established} end {end:#x} dtos {statuses:?}");
        }
        class_of((established, end, statuses, sent.len().min(1)))
    }
}
