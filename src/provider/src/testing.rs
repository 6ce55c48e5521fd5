//! What the DAT-level tests share (cfg(test)): the device a test runs over (`TestDevice`, the
//! one place that chooses it), memory the transport writes behind Rust's back (`Buffer`), and
//! one side of a connection with its IA, PZ, EVDs, EP and registered buffer (`Side`), with the
//! helpers that wait for events and connect two sides. Waits use a generous timeout only as a
//! hang guard; readiness is always an event, never a sleep.
//!
//! Compiled into the tests of two crates: this one's (the behaviour tests, over every device)
//! and daplrs-tcp's (its DAT-level tests, over TCP only; src/backend-tcp/src/tests.rs includes
//! this file). So it names the crates by their own names, and opens devices with the
//! `open_device` of the module that includes it.

use std::net::Ipv4Addr;
use std::sync::Arc;

use daplrs_backend::Sge;
use daplrs_core::consts::{close_flags, dto_op, dto_status, evd_flags, event_number, mem_priv};
use daplrs_core::cr::Cr;
use daplrs_core::ep::{Ep, EpState, RemoteBuffer};
use daplrs_core::evd::{Evd, Event, EventData};
use daplrs_core::handle;
use daplrs_core::ia::Ia;
use daplrs_core::lmr::{Lmr, LmrRegion, VA_TYPE_VA};
use daplrs_core::pz::Pz;
use daplrs_core::sp::Sp;
use daplrs_tcp::test_support::{test_hooks, Mode};

/// Hang guard for blocking waits (microseconds); never a timing assertion.
pub(crate) const GUARD_US: u32 = 20_000_000;

/// The environment variable naming the device of the verbs and ofi instantiations of the
/// behaviour tests (behaviour_tests.rs): "verbs:<device>[:<port>]" (e.g. "verbs:rxe0:1", the
/// ia_params "verbs rxe0 1"), "ofi:<provider>[:<place>]" (e.g. "ofi:verbs;ofi_rxm:rxe0"),
/// "tcp" or "samehost".
#[cfg_attr(not(any(feature = "verbs", feature = "ofi")), allow(dead_code))]
pub(crate) const DEVICE_ENV: &str = "DAPLRS_TEST_DEVICE";

/// The device a DAT-level test opens its IAs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TestDevice {
    /// The TCP backend on 127.0.0.1 with its same-host path off (DAPLRS_SAME_HOST=never):
    /// every frame crosses a socket.
    Tcp,
    /// The TCP backend on 127.0.0.1 with its same-host path required (DAPLRS_SAME_HOST=
    /// require): a connection that cannot use it fails, so a pass proves the path was used.
    SameHost,
    /// The same-host path as users get it (DAPLRS_SAME_HOST=auto): set up at a connection's
    /// first request, which goes over TCP, and switched to while requests stream.
    SameHostLazy,
    /// An RDMA port through the verbs backend; the words of its ia_params after "verbs"
    /// ("rxe0 1": device and port; the GID is the one of the port's netdev, as for any IA).
    /// The IA's address is that netdev's IPv4 address.
    #[cfg(feature = "verbs")]
    Verbs(String),
    /// A libfabric provider through the ofi backend: the words of its ia_params after "ofi"
    /// (provider and place: "tcp 127.0.0.1", "shm 127.0.0.1", "verbs;ofi_rxm rxe0").
    #[cfg(feature = "ofi")]
    Ofi(String),
}

impl TestDevice {
    /// "tcp", "samehost", "samehost-lazy", or (built with the verbs feature) "verbs:<device>[:<port>]".
    pub(crate) fn parse(s: &str) -> Result<TestDevice, String> {
        let words: Vec<&str> = s
            .split(|c: char| c == ':' || c.is_whitespace())
            .filter(|w| !w.is_empty())
            .collect();
        match words.as_slice() {
            ["tcp"] => Ok(TestDevice::Tcp),
            ["samehost"] => Ok(TestDevice::SameHost),
            ["samehost-lazy"] => Ok(TestDevice::SameHostLazy),
            #[cfg(feature = "verbs")]
            ["verbs", device] => Ok(TestDevice::Verbs(device.to_string())),
            #[cfg(feature = "verbs")]
            ["verbs", device, port] => Ok(TestDevice::Verbs(format!("{device} {port}"))),
            #[cfg(feature = "ofi")]
            ["ofi", provider] => Ok(TestDevice::Ofi(format!("{provider} 127.0.0.1"))),
            #[cfg(feature = "ofi")]
            ["ofi", provider, place] => Ok(TestDevice::Ofi(format!("{provider} {place}"))),
            // "ofi:verbs;ofi_rxm:rxe0:dgram=verbs": with datagram EPs.
            #[cfg(feature = "ofi")]
            ["ofi", provider, place, dgram] => {
                Ok(TestDevice::Ofi(format!("{provider} {place} {dgram}")))
            }
            #[cfg(not(feature = "verbs"))]
            ["verbs", ..] => Err(format!(
                "{DEVICE_ENV}={s:?}: these tests were built without the verbs feature"
            )),
            _ => Err(format!(
                "{DEVICE_ENV}={s:?}: expected tcp, samehost, samehost-lazy, verbs:<device>[:<port>] or ofi:<provider>[:<place>]"
            )),
        }
    }

    /// The device `DEVICE_ENV` names (tcp when it is unset); panics on a value it cannot use.
    #[cfg_attr(not(any(feature = "verbs", feature = "ofi")), allow(dead_code))]
    pub(crate) fn from_env() -> TestDevice {
        match std::env::var(DEVICE_ENV) {
            Ok(v) => TestDevice::parse(&v).unwrap_or_else(|e| panic!("{e}")),
            Err(_) => TestDevice::Tcp,
        }
    }

    /// The ia_params of an IA on this device.
    pub(crate) fn ia_params(&self) -> String {
        match self {
            TestDevice::Tcp | TestDevice::SameHost | TestDevice::SameHostLazy => {
                "tcp 127.0.0.1".to_string()
            }
            #[cfg(feature = "verbs")]
            TestDevice::Verbs(words) => format!("verbs {words}"),
            #[cfg(feature = "ofi")]
            TestDevice::Ofi(words) => format!("ofi {words}"),
        }
    }

    #[cfg_attr(not(feature = "ofi"), allow(dead_code))]
    pub(crate) fn is_ofi(&self) -> bool {
        #[cfg(feature = "ofi")]
        if let TestDevice::Ofi(_) = self {
            return true;
        }
        false
    }

    pub(crate) fn is_verbs(&self) -> bool {
        #[cfg(feature = "verbs")]
        if let TestDevice::Verbs(_) = self {
            return true;
        }
        false
    }

    /// Opens an IA named `name` on this device, with an async EVD of 16 entries.
    pub(crate) fn open_ia(&self, name: &str) -> Arc<Ia> {
        let params = self.ia_params();
        let open = || {
            Ia::open(name, &params, super::open_device, Some(16), 0)
                .unwrap_or_else(|e| panic!("open IA on {params:?} ({self:?}): {e:?}"))
                .0
        };
        match self {
            TestDevice::Tcp => test_hooks::open_with(Mode::Never, open).0,
            TestDevice::SameHost => test_hooks::open_with(Mode::Require, open).0,
            TestDevice::SameHostLazy => test_hooks::open_with(Mode::Auto, open).0,
            #[cfg(feature = "verbs")]
            TestDevice::Verbs(_) => open(),
            #[cfg(feature = "ofi")]
            TestDevice::Ofi(_) => open(),
        }
    }

    /// A verbs device of the soft-RoCE driver (rdma_rxe: devices named rxe<N>, as
    /// scripts/rxe-vm's rxe0).
    pub(crate) fn is_soft_roce(&self) -> bool {
        match self {
            #[cfg(feature = "verbs")]
            TestDevice::Verbs(words) => words.starts_with("rxe"),
            _ => false,
        }
    }

    /// Whether (part of) a test must not run on this device: true, after printing why, when
    /// it is a soft-RoCE device and `reason` says what that driver does not do. Printed on
    /// stdout: the guest runs the tests with --show-output, and verbs-guest.sh repeats the
    /// SKIP lines. Never silent.
    pub(crate) fn skip_on_soft_roce(&self, what: &str, reason: &str) -> bool {
        if self.is_soft_roce() {
            println!("SKIP {what} on {self:?}: {reason}");
            true
        } else {
            false
        }
    }

    /// Whether a test must not run on this device: true (after printing why) when it is a
    /// verbs device and `reason` says why verbs cannot do what the test asks. Never silent.
    #[allow(dead_code)] // while no behaviour test needs it
    pub(crate) fn skip_on_verbs(&self, test: &str, reason: &str) -> bool {
        if self.is_verbs() {
            println!("SKIP {test} on {self:?}: {reason}");
            true
        } else {
            false
        }
    }
}

/// Memory the transport writes behind Rust's back: accessed only through its raw pointer.
/// A mapping of its own, zero-filled: two heap buffers may share a page, and a region with a
/// page in another region's arena gets none (daplrs_backend::arena), which tests of the same-host
/// path must not depend on.
pub(crate) struct Buffer {
    pages: daplrs_tcp::test_support::Pages,
    len: usize,
}

impl Buffer {
    pub(crate) fn new(len: usize) -> Buffer {
        let pages = daplrs_tcp::test_support::Pages::new(len.max(1));
        Buffer { pages, len }
    }
    pub(crate) fn addr(&self) -> u64 {
        self.pages.addr()
    }
    pub(crate) fn len(&self) -> usize {
        debug_assert!(self.len <= self.pages.len);
        self.len
    }
    pub(crate) fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len());
        let mut out = vec![0u8; len];
        // SAFETY: in bounds of our allocation; the transport is quiescent for this range once
        // the completion we waited for was delivered.
        unsafe { std::ptr::copy_nonoverlapping(self.pages.ptr.add(off), out.as_mut_ptr(), len) };
        out
    }
    pub(crate) fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len());
        // SAFETY: in bounds; no transfer targets this range while the test writes it.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.pages.ptr.add(off), data.len())
        };
    }
}

/// One end of a connection: an IA with a PZ, a DTO EVD (also for RMR binds), a connection EVD,
/// a CR EVD, an EP on them, and a 4 KiB buffer registered as an LMR.
pub(crate) struct Side {
    pub(crate) ia: Arc<Ia>,
    pub(crate) pz: Arc<Pz>,
    pub(crate) dto: Arc<Evd>,
    pub(crate) conn: Arc<Evd>,
    pub(crate) cr: Arc<Evd>,
    pub(crate) ep: Arc<Ep>,
    pub(crate) buf: Buffer,
    pub(crate) lmr: Arc<Lmr>,
    /// Its device pads the private data it delivers (`assert_private_data`).
    pub(crate) pads_private_data: bool,
}

impl Side {
    /// Registers another buffer of this side's, with every privilege.
    pub(crate) fn register(&self, buf: &Buffer) -> Arc<Lmr> {
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

    /// A side on the TCP backend at 127.0.0.1, its same-host mode the calling thread's (see
    /// `test_hooks::open_with`; DAPLRS_SAME_HOST otherwise): for the TCP backend's own tests
    /// (daplrs-tcp's, which include this file; unused in the `daplrs` crate's).
    #[allow(dead_code)]
    pub(crate) fn new(name: &str, privileges: u32) -> Side {
        let (ia, _) =
            Ia::open(name, "tcp 127.0.0.1", super::open_device, Some(16), 0).expect("open IA");
        Side::with_ia(ia, privileges, false)
    }

    /// A side on `dev`; its LMR grants `privileges`.
    pub(crate) fn on(dev: &TestDevice, name: &str, privileges: u32) -> Side {
        Side::with_ia(dev.open_ia(name), privileges, dev.is_verbs())
    }

    fn with_ia(ia: Arc<Ia>, privileges: u32, pads_private_data: bool) -> Side {
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
            pads_private_data,
        }
    }

    /// Asserts that `got`, private data this side received (of a connection request, an
    /// accept or a reject), is `sent`. Over TCP exactly; over verbs `sent` followed by zeros
    /// only: rdma_cm hands over the whole private data area of the CM message (56 bytes of a
    /// REQ, 196 of a REP, ...), whose length does not travel with it, as OFED's provider does.
    pub(crate) fn assert_private_data(&self, got: &[u8], sent: &[u8]) {
        if self.pads_private_data && got.len() >= sent.len() {
            assert_eq!(&got[..sent.len()], sent, "private data");
            assert!(
                got[sent.len()..].iter().all(|&b| b == 0),
                "private data {got:?}: {sent:?} then more than zeros"
            );
        } else {
            assert_eq!(got, sent, "private data");
        }
    }

    /// Whether (part of) a test must not run on this side's device: true, after printing why,
    /// when its transport is iWARP (soft-iWARP siw, ...) and `reason` says what iWARP does not
    /// do (no RNR retry: a send without a receive ends the connection; a remote access
    /// violation comes back as a TERMINATE that ends the connection, not as the request's
    /// error). Never silent.
    pub(crate) fn skip_on_iwarp(&self, what: &str, reason: &str) -> bool {
        let attr = self.ia.device().attr();
        if attr.transport == "iWARP" {
            println!("SKIP {what} on {}: {reason}", self.ia.device().name());
            true
        } else {
            false
        }
    }

    /// Whether a test of RMRs must not run: true, after printing why, when this side's device
    /// has no memory windows (max_rmrs 0: siw), where Rmr::create is refused.
    pub(crate) fn skip_without_rmrs(&self, what: &str) -> bool {
        if self.ia.device().attr().max_mw == 0 {
            println!(
                "SKIP {what} on {}: no RMRs (the device has no memory windows)",
                self.ia.device().name()
            );
            true
        } else {
            false
        }
    }

    /// Whether a test of SRQs must not run: true, after printing why, when this side's device
    /// has none (max_srq 0: libfabric's reliable-datagram entries so far).
    pub(crate) fn skip_without_srqs(&self, what: &str) -> bool {
        if self.ia.device().attr().max_srq == 0 {
            println!("SKIP {what} on {}: no SRQs", self.ia.device().name());
            true
        } else {
            false
        }
    }

    /// How many local segments an RDMA read fills on this side's device (siw: one).
    pub(crate) fn read_segments(&self) -> u32 {
        self.ia.device().attr().max_rdma_read_sge
    }

    /// Where peers connect to this side's service points: its IA's address.
    pub(crate) fn addr(&self) -> Ipv4Addr {
        self.ia.address()
    }

    pub(crate) fn seg(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.buf.addr() + off as u64,
            length: len,
            lkey: self.lmr.lmr_context(),
        }
    }

    pub(crate) fn remote(&self, off: usize, len: u32) -> RemoteBuffer {
        RemoteBuffer {
            address: self.buf.addr() + off as u64,
            length: len,
            rmr_context: self.lmr.rmr_context(),
        }
    }
}

/// Posts an 8-byte RDMA read on `side`'s EP into the start of its buffer, cookie `id`.
pub(crate) fn read_8_bytes(side: &Side, id: u64, address: u64, rmr_context: u32) {
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

pub(crate) fn next(evd: &Evd) -> Event {
    evd.wait(GUARD_US, 1)
        .expect("event before the hang guard")
        .0
}

pub(crate) fn dto(ev: &Event) -> (u64, u32, u32, u32) {
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

/// Waits for a CR on `evd` and returns it.
pub(crate) fn next_cr(evd: &Evd) -> Arc<Cr> {
    let ev = next(evd);
    let EventData::CrArrival { cr, .. } = ev.data else {
        panic!("expected a CR, got {ev:?}")
    };
    handle::cr(cr).expect("live CR")
}

/// Waits until a thread is in `evd.wait` (readiness by polling the flag; the hang guard bounds
/// it).
pub(crate) fn until_waiting(evd: &Evd) {
    let end = std::time::Instant::now() + std::time::Duration::from_micros(u64::from(GUARD_US));
    while !evd.has_waiter() {
        assert!(std::time::Instant::now() < end, "no waiter");
        std::thread::yield_now();
    }
}

/// Connects client to server through a PSP, with private data both ways.
pub(crate) fn connect_pair(server: &Side, client: &Side) -> Arc<Sp> {
    let (psp, port) = Sp::create_psp_any(&server.ia, &server.cr, 0).expect("psp");
    client
        .ep
        .connect(server.addr(), port, GUARD_US, b"hello", 0, 0)
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
    server.assert_private_data(&cr.query().private_data, b"hello");
    cr.accept(Some(&server.ep), b"welcome").expect("accept");
    assert!(handle::cr(cr.handle()).is_err(), "accept consumes the CR");
    let ev = next(&server.conn);
    assert_eq!(ev.number, event_number::CONNECTION_ESTABLISHED);
    let ev = next(&client.conn);
    assert_eq!(ev.number, event_number::CONNECTION_ESTABLISHED);
    match ev.data {
        EventData::Connection { ep, private_data } => {
            assert_eq!(ep, client.ep.handle());
            client.assert_private_data(&private_data, b"welcome");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(client.ep.state(), EpState::Connected);
    assert_eq!(server.ep.state(), EpState::Connected);
    psp
}

pub(crate) fn close(sides: &[&Side]) {
    for s in sides {
        s.ia.close(close_flags::ABRUPT).expect("close IA");
    }
}

/// An RDMA read past the end of the server's region: REMOTE_ACCESS, and the connection breaks.
pub(crate) fn out_of_range_read_breaks_the_connection(server: &Side, client: &Side) {
    client
        .ep
        .post_rdma_read(&[client.seg(0, 32)], 1, server.remote(4090, 32), 0)
        .expect("post out of range");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::REMOTE_ACCESS);
    assert_eq!(next(&client.conn).number, event_number::CONNECTION_BROKEN);
}

/// An RDMA write under a wrong rkey, and one behind it: REMOTE_ACCESS, then FLUSHED, BROKEN on
/// both sides, the target's memory untouched.
pub(crate) fn bad_rkey_write_breaks_the_connection(server: &Side, client: &Side) {
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
fn test_device_names() {
    assert_eq!(TestDevice::parse("tcp"), Ok(TestDevice::Tcp));
    assert_eq!(TestDevice::parse(" samehost "), Ok(TestDevice::SameHost));
    assert_eq!(
        TestDevice::parse("samehost-lazy"),
        Ok(TestDevice::SameHostLazy)
    );
    assert!(!TestDevice::parse("samehost").expect("samehost").is_verbs());
    assert!(TestDevice::parse("tcp:lo").is_err());
    assert!(TestDevice::parse("").is_err());
    #[cfg(feature = "verbs")]
    {
        let dev = TestDevice::parse("verbs:rxe0:1").expect("verbs device and port");
        assert!(dev.is_verbs());
        assert_eq!(dev.ia_params(), "verbs rxe0 1");
        assert_eq!(
            TestDevice::parse("verbs rxenet0").map(|d| d.ia_params()),
            Ok("verbs rxenet0".to_string())
        );
    }
    #[cfg(not(feature = "verbs"))]
    assert!(TestDevice::parse("verbs:rxe0:1").is_err());
    #[cfg(feature = "ofi")]
    {
        let dev = TestDevice::parse("ofi:verbs;ofi_rxm:rxe0").expect("provider and place");
        assert!(dev.is_ofi() && !dev.is_verbs());
        assert_eq!(dev.ia_params(), "ofi verbs;ofi_rxm rxe0");
        assert_eq!(
            TestDevice::parse("ofi shm").map(|d| d.ia_params()),
            Ok("ofi shm 127.0.0.1".to_string())
        );
    }
}
