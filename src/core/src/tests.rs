//! Unit tests of the core's object model: handles, in-use rules, EVD queues, CNO, EP states.

use std::sync::Arc;
use std::time::Duration;

use super::cno::Cno;
use super::consts::{async_reason, close_flags, evd_flags, event_number, handle_type, mem_priv};
use super::ep::{Ep, EpAttr, EpModify, EpState, RemoteBuffer};
use super::error::{DatError, ErrorType, Param, SubType};
use super::evd::{Evd, EventData};
use super::handle::{self, Handle};
use super::ia::Ia;
use super::lmr::{Lmr, LmrRegion, VA_TYPE_VA};
use super::pz::Pz;
use super::rmr::Rmr;
use super::sp::Sp;
use super::srq::{Srq, SrqAttr};
use daplrs_backend::Sge;

/// Hang guard for blocking waits (microseconds); never a timing assertion.
const GUARD_US: u32 = 10_000_000;

/// What the device factory (`daplrs::device`) does with "tcp <target>", and NoDevice for the
/// rest: the core knows no backend; its tests open TCP devices (a dev-dependency).
fn open_device(ia_params: &str) -> daplrs_backend::Result<Arc<dyn daplrs_backend::Device>> {
    match ia_params.split_whitespace().collect::<Vec<_>>()[..] {
        ["tcp", target] => Ok(daplrs_tcp::TcpDevice::open(target)?),
        _ => Err(daplrs_backend::Error::NoDevice),
    }
}

fn open_ia() -> (Arc<Ia>, Arc<Evd>) {
    let (ia, async_evd) =
        Ia::open("test-ia", "tcp 127.0.0.1", open_device, Some(8), 0).expect("open IA on lo");
    (ia, async_evd.expect("implicit async EVD"))
}

fn kind(e: DatError) -> (ErrorType, SubType) {
    (e.kind, e.sub)
}

#[test]
fn ia_reports_the_interface_address() {
    let (ia, _) = open_ia();
    let attr = ia.query();
    assert_eq!(attr.address, std::net::Ipv4Addr::LOCALHOST);
    assert!(attr.max_eps > 0 && attr.max_evd_qlen > 0 && attr.max_message_size > 0);
    let (by_name, _) =
        Ia::open("by-name", "tcp lo", open_device, None, 0).expect("open IA on interface lo");
    assert_eq!(by_name.address(), std::net::Ipv4Addr::LOCALHOST);
    by_name
        .close(close_flags::GRACEFUL)
        .expect("graceful close of an empty IA");
    ia.close(close_flags::GRACEFUL)
        .expect("graceful close with only the async EVD");
}

#[test]
fn unknown_interface_is_refused() {
    let e = Ia::open("x", "tcp no-such-if0", open_device, None, 0).expect_err("must fail");
    assert_eq!(e.kind, ErrorType::InsufficientResources);
    let e = Ia::open("x", "ib0 0", open_device, None, 0).expect_err("must fail");
    assert_eq!(e.kind, ErrorType::ProviderNotFound);
}

#[test]
fn freed_stale_and_wrong_type_handles_are_rejected() {
    let (ia, _) = open_ia();
    let pz = Pz::create(&ia).expect("pz");
    let pz_handle = pz.handle();
    assert_eq!(handle::handle_type(pz_handle), Ok(handle_type::PZ));
    assert!(Arc::ptr_eq(&handle::pz(pz_handle).expect("live pz"), &pz));

    // Wrong type: a PZ handle used as an EP gives INVALID_HANDLE_EP.
    let e = handle::ep(pz_handle).expect_err("wrong type");
    assert_eq!(e.code(), 0x8005_000c);
    // NULL and a pointer we never handed out.
    assert_eq!(
        kind(handle::lmr(Handle::NULL).expect_err("null")),
        (ErrorType::InvalidHandle, SubType::InvalidHandleLmr)
    );
    let bogus = Handle::from_ptr(0x1234_5678 as *const std::ffi::c_void);
    assert_eq!(
        handle::cno(bogus).expect_err("bogus").sub,
        SubType::InvalidHandleCno
    );

    handle::set_consumer_context(pz_handle, 77).expect("set context");
    assert_eq!(handle::consumer_context(pz_handle), Ok(77));

    pz.free().expect("free pz");
    assert_eq!(
        handle::pz(pz_handle).expect_err("freed").sub,
        SubType::InvalidHandlePz
    );
    assert_eq!(
        pz.free().expect_err("double free").sub,
        SubType::InvalidHandlePz
    );
    assert!(handle::handle_type(pz_handle).is_err());
    assert!(handle::consumer_context(pz_handle).is_err());
    ia.close(close_flags::ABRUPT).expect("close");
    assert_eq!(
        handle::ia(ia.handle()).expect_err("closed ia").code(),
        0x8005_000b
    );
}

#[test]
fn in_use_rules() {
    let (ia, _) = open_ia();
    let pz = Pz::create(&ia).expect("pz");
    let cno = Cno::create(&ia, None, (0, 0)).expect("cno");
    let evd = Evd::create(
        &ia,
        16,
        Some(cno.clone()),
        evd_flags::DTO | evd_flags::CONNECTION,
    )
    .expect("evd");
    let ep = Ep::create(
        &ia,
        Some(pz.clone()),
        Some(evd.clone()),
        Some(evd.clone()),
        Some(evd.clone()),
        None,
        None,
    )
    .expect("ep");

    assert_eq!(pz.free().expect_err("pz in use").code(), 0x8007_0053);
    assert_eq!(
        kind(evd.free().expect_err("evd in use")),
        (ErrorType::InvalidState, SubType::EvdInUse)
    );
    assert_eq!(
        kind(cno.free().expect_err("cno in use")),
        (ErrorType::InvalidState, SubType::CnoInUse)
    );
    assert_eq!(
        kind(ia.close(close_flags::GRACEFUL).expect_err("ia in use")),
        (ErrorType::InvalidState, SubType::IaInUse)
    );

    ep.free().expect("free ep");
    evd.free().expect("free evd once the EP is gone");
    cno.free().expect("free cno once the EVD is gone");

    let mut buf = vec![0u8; 4096];
    let lmr = Lmr::create(
        &ia,
        LmrRegion::Virtual {
            address: buf.as_mut_ptr() as u64,
            length: buf.len() as u64,
        },
        &pz,
        mem_priv::ALL,
        VA_TYPE_VA,
    )
    .expect("lmr");
    assert_eq!(pz.free().expect_err("pz used by lmr").sub, SubType::PzInUse);
    let rmr = Rmr::create(&pz).expect("rmr");
    lmr.free().expect("free lmr");
    assert_eq!(pz.free().expect_err("pz used by rmr").sub, SubType::PzInUse);
    rmr.free().expect("free rmr");

    let srq = Srq::create(
        &ia,
        &pz,
        SrqAttr {
            max_recv_dtos: 8,
            max_recv_iov: 2,
            low_watermark: 0,
        },
    )
    .expect("srq");
    let ep2 = Ep::create(
        &ia,
        Some(pz.clone()),
        None,
        None,
        None,
        Some(srq.clone()),
        None,
    )
    .expect("ep with srq");
    assert_eq!(srq.free().expect_err("srq in use").sub, SubType::SrqInUse);
    assert_eq!(srq.query().ep_count, 1);
    ep2.free().expect("free ep2");
    srq.free().expect("free srq");
    pz.free().expect("free pz last");
    ia.close(close_flags::GRACEFUL)
        .expect("graceful close of an emptied IA");
}

#[test]
fn abrupt_close_tears_down_every_child() {
    let (ia, async_evd) = open_ia();
    let pz = Pz::create(&ia).expect("pz");
    let evd = Evd::create(
        &ia,
        8,
        None,
        evd_flags::DTO | evd_flags::CONNECTION | evd_flags::CR,
    )
    .expect("evd");
    let ep = Ep::create(
        &ia,
        Some(pz.clone()),
        Some(evd.clone()),
        Some(evd.clone()),
        Some(evd.clone()),
        None,
        None,
    )
    .expect("ep");
    let psp = Sp::create_psp_any(&ia, &evd, 0).expect("psp").0;
    let mut buf = vec![0u8; 64];
    let lmr = Lmr::create(
        &ia,
        LmrRegion::Virtual {
            address: buf.as_mut_ptr() as u64,
            length: 64,
        },
        &pz,
        mem_priv::ALL,
        VA_TYPE_VA,
    )
    .expect("lmr");
    let handles = [
        ep.handle(),
        psp.handle(),
        lmr.handle(),
        evd.handle(),
        pz.handle(),
        async_evd.handle(),
    ];
    ia.close(close_flags::ABRUPT).expect("abrupt close");
    for h in handles {
        assert!(handle::lookup_any(h).is_none(), "child {h:?} survived");
    }
    assert!(handle::lookup_any(ia.handle()).is_none());
}

#[test]
fn evd_queue_dequeue_threshold_and_overflow() {
    let (ia, _) = open_ia();
    let evd = Evd::create(&ia, 2, None, evd_flags::SOFTWARE).expect("evd");
    assert_eq!(evd.dequeue().expect_err("empty").code(), 0x800d_0000);
    evd.post_se(1).expect("se 1");
    // Threshold 2 with one event: times out (the short timeout is the point, not a measurement).
    assert_eq!(
        evd.wait(1000, 2).expect_err("below threshold").kind,
        ErrorType::TimeoutExpired
    );
    evd.post_se(2).expect("se 2");
    assert_eq!(evd.post_se(3).expect_err("full").kind, ErrorType::QueueFull);
    let (ev, more) = evd.wait(GUARD_US, 2).expect("threshold reached");
    assert_eq!(ev.number, event_number::SOFTWARE);
    assert_eq!(ev.data, EventData::Software { pointer: 1 });
    assert_eq!(more, 1);
    assert_eq!(
        evd.wait(GUARD_US, 3).expect_err("threshold > qlen"),
        DatError::bad(Param::Threshold)
    );
    assert_eq!(
        evd.resize(0).expect_err("bad qlen").kind,
        ErrorType::InvalidParameter
    );
    evd.resize(4).expect("grow");
    assert_eq!(evd.query().qlen, 4);
    let ev = evd.dequeue().expect("second");
    assert_eq!(ev.data, EventData::Software { pointer: 2 });
    evd.post_se(5).expect("se");
    evd.post_se(6).expect("se");
    assert_eq!(
        evd.resize(1).expect_err("shrink below count").kind,
        ErrorType::InvalidState
    );
    ia.close(close_flags::ABRUPT).expect("close");
}

/// Readiness check: returns once a thread blocks in `evd.wait` (hang guard: 20 s).
fn wait_for_waiter(evd: &Evd) {
    let guard = std::time::Instant::now() + Duration::from_secs(20);
    while !evd.has_waiter() {
        assert!(std::time::Instant::now() < guard, "waiter never blocked");
        std::thread::yield_now();
    }
}

#[test]
fn evd_waiter_is_woken_and_unwaitable_releases_it() {
    let (ia, _) = open_ia();
    let evd = Evd::create(&ia, 4, None, evd_flags::SOFTWARE).expect("evd");
    let e2 = evd.clone();
    let waiter = std::thread::spawn(move || e2.wait(GUARD_US, 1));
    // Readiness: the waiter is registered once a second waiter is refused.
    wait_for_waiter(&evd);
    assert_eq!(
        evd.wait(0, 1).expect_err("second waiter").sub,
        SubType::EvdWaiter
    );
    evd.post_se(42).expect("post");
    let (ev, _) = waiter.join().expect("join").expect("woken");
    assert_eq!(ev.data, EventData::Software { pointer: 42 });

    let e3 = evd.clone();
    let waiter = std::thread::spawn(move || e3.wait(GUARD_US, 1));
    wait_for_waiter(&evd);
    evd.set_waitable(false);
    let e = waiter.join().expect("join").expect_err("released");
    assert_eq!(kind(e), (ErrorType::InvalidState, SubType::EvdUnwaitable));
    assert_eq!(
        evd.wait(0, 1).expect_err("unwaitable").sub,
        SubType::EvdUnwaitable
    );
    evd.set_waitable(true);
    assert_eq!(
        evd.wait(0, 1).expect_err("empty").kind,
        ErrorType::TimeoutExpired
    );
    ia.close(close_flags::ABRUPT).expect("close");
}

#[test]
fn cno_is_triggered_by_an_enabled_evd() {
    let (ia, _) = open_ia();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let cno = Cno::create(&ia, Some(Arc::new(move |h| seen2.lock().push(h))), (1, 2)).expect("cno");
    assert_eq!(cno.query().agent_words, (1, 2));
    let evd = Evd::create(&ia, 4, Some(cno.clone()), evd_flags::SOFTWARE).expect("evd");
    assert_eq!(evd.query().cno, cno.handle());

    evd.set_enabled(false);
    evd.post_se(1).expect("post");
    assert_eq!(
        cno.wait(1000)
            .expect_err("disabled EVD does not trigger")
            .kind,
        ErrorType::TimeoutExpired
    );
    evd.set_enabled(true);
    evd.post_se(2).expect("post");
    // The fd is readable now.
    let mut fds = [libc::pollfd {
        fd: cno.fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: one valid pollfd, count 1.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, 10_000) };
    assert_eq!(n, 1);
    assert_eq!(cno.wait(GUARD_US), Ok(evd.handle()));
    assert_eq!(seen.lock().as_slice(), &[evd.handle()]);

    evd.modify_cno(None).expect("detach");
    cno.free().expect("free detached cno");
    ia.close(close_flags::ABRUPT).expect("close");
}

#[test]
fn ep_states_and_attributes() {
    let (ia, _) = open_ia();
    let pz = Pz::create(&ia).expect("pz");
    let dto = Evd::create(&ia, 16, None, evd_flags::DTO).expect("dto evd");
    let conn = Evd::create(&ia, 16, None, evd_flags::CONNECTION).expect("conn evd");

    // Role checks on EVDs.
    let e = Ep::create(
        &ia,
        Some(pz.clone()),
        Some(conn.clone()),
        None,
        None,
        None,
        None,
    )
    .expect_err("recv evd lacks DTO");
    assert_eq!(e.sub, SubType::InvalidHandleEvdRecv);
    let e = Ep::create(
        &ia,
        Some(pz.clone()),
        None,
        None,
        Some(dto.clone()),
        None,
        None,
    )
    .expect_err("conn evd lacks flag");
    assert_eq!(e.sub, SubType::InvalidHandleEvdConn);

    let dev = ia.device().attr();
    let mut bad = EpAttr::defaults(&dev);
    bad.max_recv_dtos = dev.max_qp_wr + 1;
    let e = Ep::create(&ia, Some(pz.clone()), None, None, None, None, Some(bad))
        .expect_err("attrs over limits");
    assert_eq!(e, DatError::bad(Param::EpAttributes));

    let ep = Ep::create(
        &ia,
        Some(pz.clone()),
        Some(dto.clone()),
        Some(dto.clone()),
        Some(conn.clone()),
        None,
        None,
    )
    .expect("ep with defaults");
    let p = ep.query();
    assert_eq!(p.state, EpState::Unconnected);
    assert_eq!(p.pz, pz.handle());
    assert_eq!(p.attr, EpAttr::defaults(&dev));

    let mut buf = vec![0u8; 256];
    let lmr = Lmr::create(
        &ia,
        LmrRegion::Virtual {
            address: buf.as_mut_ptr() as u64,
            length: 256,
        },
        &pz,
        mem_priv::ALL,
        VA_TYPE_VA,
    )
    .expect("lmr");
    let seg = Sge {
        addr: buf.as_ptr() as u64,
        length: 64,
        lkey: lmr.lmr_context(),
    };
    // Requests need CONNECTED or DISCONNECTED.
    assert_eq!(
        ep.post_send(&[seg], 1, 0).expect_err("unconnected").code(),
        0x8007_002f
    );
    let remote = RemoteBuffer {
        address: 0,
        length: 8,
        rmr_context: 0,
    };
    assert_eq!(
        ep.post_rdma_read(&[seg], 1, remote, 0)
            .expect_err("unconnected")
            .sub,
        SubType::EpUnconnected
    );
    // UNSIGNALLED needs the EP configured for it.
    assert_eq!(
        ep.post_send(&[seg], 1, 4).expect_err("unsignalled").kind,
        ErrorType::InvalidParameter
    );

    // Receives may be posted before connecting; local checks apply.
    ep.post_recv(&[seg], 7, 0).expect("recv before connect");
    assert_eq!(ep.recv_query().expect("recv query").0, 1);
    let outside = Sge {
        addr: buf.as_ptr() as u64 + 200,
        length: 100,
        lkey: lmr.lmr_context(),
    };
    assert_eq!(
        ep.post_recv(&[outside], 8, 0).expect_err("outside lmr"),
        DatError::bad(Param::LocalIov)
    );
    let bad_key = Sge {
        addr: buf.as_ptr() as u64,
        length: 8,
        lkey: lmr.lmr_context() ^ 0x5500,
    };
    assert_eq!(
        ep.post_recv(&[bad_key], 9, 0)
            .expect_err("unknown lmr")
            .kind,
        ErrorType::PrivilegesViolation
    );

    ep.set_watermark(4, 8).expect("watermark");
    ep.reset().expect("reset of an unconnected EP");
    assert_eq!(
        ep.disconnect(close_flags::GRACEFUL)
            .expect_err("not connected")
            .sub,
        SubType::EpUnconnected
    );

    // Unconfigured EP (no PZ) becomes UNCONNECTED when modified to have one.
    let ep2 = Ep::create(&ia, None, None, None, None, None, None).expect("ep without pz");
    assert_eq!(ep2.state(), EpState::UnconfiguredUnconnected);
    assert_eq!(
        ep2.post_recv(&[seg], 1, 0).expect_err("unconfigured").sub,
        SubType::EpUnconfigured
    );
    ep2.modify(EpModify {
        pz: Some(pz.clone()),
        recv_evd: Some(Some(dto.clone())),
        ..Default::default()
    })
    .expect("modify");
    assert_eq!(ep2.state(), EpState::Unconnected);
    assert_eq!(ep2.query().recv_evd, dto.handle());

    // Freeing an EP flushes its posted receive into the recv EVD.
    ep.free().expect("free ep");
    let (ev, _) = dto.wait(GUARD_US, 1).expect("flushed recv");
    match ev.data {
        EventData::Dto { cookie, status, .. } => {
            assert_eq!(cookie, 7);
            assert_eq!(status, super::consts::dto_status::FLUSHED);
        }
        other => panic!("unexpected event {other:?}"),
    }
    ia.close(close_flags::ABRUPT).expect("close");
}

#[test]
fn lmr_contexts_are_unique_and_queryable() {
    let (ia, _) = open_ia();
    let pz = Pz::create(&ia).expect("pz");
    let mut a = vec![0u8; 128];
    let mut b = vec![0u8; 128];
    let la = Lmr::create(
        &ia,
        LmrRegion::Virtual {
            address: a.as_mut_ptr() as u64,
            length: 128,
        },
        &pz,
        mem_priv::LOCAL_READ | mem_priv::LOCAL_WRITE,
        VA_TYPE_VA,
    )
    .expect("lmr a");
    let lb = Lmr::create(
        &ia,
        LmrRegion::Virtual {
            address: b.as_mut_ptr() as u64,
            length: 128,
        },
        &pz,
        mem_priv::ALL,
        VA_TYPE_VA,
    )
    .expect("lmr b");
    assert_ne!(la.lmr_context(), lb.lmr_context());
    let q = lb.query();
    assert_eq!(
        (q.address, q.length, q.pz, q.mem_priv),
        (b.as_ptr() as u64, 128, pz.handle(), mem_priv::ALL)
    );
    let shared = Lmr::create(
        &ia,
        LmrRegion::Lmr(lb.clone()),
        &pz,
        mem_priv::LOCAL_READ,
        VA_TYPE_VA,
    )
    .expect("shared");
    assert_eq!(shared.address(), lb.address());
    assert_ne!(shared.lmr_context(), lb.lmr_context());
    assert_eq!(
        Lmr::create(
            &ia,
            LmrRegion::Virtual {
                address: a.as_mut_ptr() as u64,
                length: 0
            },
            &pz,
            mem_priv::ALL,
            VA_TYPE_VA
        )
        .expect_err("zero length")
        .kind,
        ErrorType::LengthError
    );
    assert_eq!(
        Lmr::create(
            &ia,
            LmrRegion::Virtual {
                address: a.as_mut_ptr() as u64,
                length: 8
            },
            &pz,
            0x400,
            VA_TYPE_VA
        )
        .expect_err("bad privileges"),
        DatError::bad(Param::Privileges)
    );
    let old = la.lmr_context();
    la.free().expect("free");
    let live: Vec<u32> = (0..8)
        .map(|_| {
            Lmr::create(
                &ia,
                LmrRegion::Virtual {
                    address: a.as_mut_ptr() as u64,
                    length: 64,
                },
                &pz,
                mem_priv::ALL,
                VA_TYPE_VA,
            )
            .expect("lmr")
            .lmr_context()
        })
        .collect();
    assert!(!live.contains(&lb.lmr_context()));
    let _ = old;
    ia.close(close_flags::ABRUPT).expect("close");
}

#[test]
fn service_points_and_conn_quals() {
    let (ia, _) = open_ia();
    let cr_evd = Evd::create(&ia, 8, None, evd_flags::CR).expect("cr evd");
    let conn_evd = Evd::create(&ia, 8, None, evd_flags::CONNECTION).expect("conn evd");
    let e = Sp::create_psp_any(&ia, &conn_evd, 0).expect_err("evd without CR flag");
    assert_eq!(e.sub, SubType::InvalidHandleEvdCr);
    let (psp, port) = Sp::create_psp_any(&ia, &cr_evd, 0).expect("psp any");
    assert_ne!(port, 0);
    assert_eq!(psp.query().conn_qual, port);
    let e = Sp::create_psp(&ia, port, &cr_evd, 0).expect_err("port taken");
    assert_eq!(e.kind, ErrorType::ConnQualInUse);
    assert_eq!(
        Sp::create_psp(&ia, 0, &cr_evd, 0).expect_err("not a port"),
        DatError::bad(Param::ConnQual)
    );
    assert_eq!(super::sp::port_of_conn_qual(80), Some(80));
    assert!(super::sp::port_of_conn_qual(0x0AFF_AB1E)
        .map(|p| p > 33000)
        .unwrap_or(false));
    assert_eq!(
        cr_evd.free().expect_err("evd used by psp").sub,
        SubType::EvdInUse
    );

    let pz = Pz::create(&ia).expect("pz");
    let ep = Ep::create(
        &ia,
        Some(pz.clone()),
        None,
        None,
        Some(conn_evd.clone()),
        None,
        None,
    )
    .expect("ep");
    let (any, _) = Sp::create_psp_any(&ia, &cr_evd, 0).expect("another psp");
    let rsp_port = any.conn_qual();
    any.free().expect("free");
    // The port may be taken by someone else in between; only assert when we got it.
    if let Ok(rsp) = Sp::create_rsp(&ia, rsp_port, &ep, &cr_evd) {
        assert_eq!(ep.state(), EpState::Reserved);
        assert_eq!(rsp.query().ep, ep.handle());
        rsp.free().expect("free rsp");
        assert_eq!(ep.state(), EpState::Unconnected);
    }
    psp.free().expect("free psp");
    // The port is free again.
    let again = Sp::create_psp(&ia, port, &cr_evd, 0);
    if let Ok(p) = again {
        p.free().expect("free");
    }
    ia.close(close_flags::ABRUPT).expect("close");
}

/// A post's LMR check refuses a freed LMR right after a check of it that succeeded (the
/// guard for any cache of LMRs on the post path), another PZ's, and a segment past the end.
#[test]
fn lmr_check_sees_a_free_after_a_cached_check() {
    let (ia, _) = open_ia();
    let pz = Pz::create(&ia).expect("pz");
    let other_pz = Pz::create(&ia).expect("other pz");
    let mut buf = vec![0u8; 64];
    let region = LmrRegion::Virtual {
        address: buf.as_mut_ptr() as u64,
        length: 64,
    };
    let lmr = Lmr::create(&ia, region, &pz, mem_priv::ALL, VA_TYPE_VA).expect("lmr");
    let seg = Sge {
        addr: buf.as_ptr() as u64,
        length: 64,
        lkey: lmr.lmr_context(),
    };
    let pz_id = Arc::as_ptr(&pz) as usize;
    let check = |pz: usize, seg: Sge| ia.lmrs.check_iov(pz, &[seg], mem_priv::LOCAL_READ);
    for _ in 0..2 {
        assert_eq!(check(pz_id, seg).expect("live lmr").1, 64);
    }
    let other = Arc::as_ptr(&other_pz) as usize;
    assert_eq!(
        check(other, seg).expect_err("other pz").kind,
        ErrorType::ProtectionViolation
    );
    let past_end = Sge { length: 65, ..seg };
    assert_eq!(
        check(pz_id, past_end).expect_err("past the end"),
        DatError::bad(Param::LocalIov)
    );
    lmr.free().expect("free");
    assert_eq!(
        check(pz_id, seg).expect_err("freed lmr").kind,
        ErrorType::PrivilegesViolation
    );
    ia.close(close_flags::ABRUPT).expect("close");
}

#[test]
fn srq_create_query_and_post() {
    let (ia, _) = open_ia();
    let pz = Pz::create(&ia).expect("pz");
    let e = Srq::create(
        &ia,
        &pz,
        SrqAttr {
            max_recv_dtos: 0,
            max_recv_iov: 1,
            low_watermark: 0,
        },
    )
    .expect_err("zero dtos");
    assert_eq!(e, DatError::bad(Param::SrqAttr));
    let srq = Srq::create(
        &ia,
        &pz,
        SrqAttr {
            max_recv_dtos: 2,
            max_recv_iov: 1,
            low_watermark: 0,
        },
    )
    .expect("srq");
    let mut buf = vec![0u8; 64];
    let lmr = Lmr::create(
        &ia,
        LmrRegion::Virtual {
            address: buf.as_mut_ptr() as u64,
            length: 64,
        },
        &pz,
        mem_priv::ALL,
        VA_TYPE_VA,
    )
    .expect("lmr");
    let seg = Sge {
        addr: buf.as_ptr() as u64,
        length: 64,
        lkey: lmr.lmr_context(),
    };
    srq.post_recv(&[seg], 1).expect("post 1");
    srq.post_recv(&[seg], 2).expect("post 2");
    assert_eq!(
        srq.post_recv(&[seg], 3).expect_err("full").kind,
        ErrorType::InsufficientResources
    );
    assert_eq!(srq.query().available_dto_count, 2);
    assert_eq!(
        srq.resize(1).expect_err("below posted").kind,
        ErrorType::InvalidState
    );
    srq.resize(4).expect("grow");
    srq.set_lw(1).expect("lw");
    assert_eq!(
        srq.query().attr,
        SrqAttr {
            max_recv_dtos: 4,
            max_recv_iov: 1,
            low_watermark: 1
        }
    );
    ia.close(close_flags::ABRUPT).expect("close");
}

#[test]
fn srq_low_watermark_fires_once_per_setting() {
    let (ia, async_evd) = open_ia();
    let pz = Pz::create(&ia).expect("pz");
    let lw_event = |srq: &Srq| {
        let ev = async_evd.dequeue().expect("low-watermark event");
        assert_eq!(ev.number, event_number::ASYNC_EP_BROKEN);
        assert_eq!(
            ev.data,
            EventData::Async {
                handle: srq.handle(),
                reason: async_reason::SRQ_LOW_WATERMARK,
            }
        );
    };
    let attr = |low_watermark| SrqAttr {
        max_recv_dtos: 4,
        max_recv_iov: 1,
        low_watermark,
    };
    // Created with a watermark and nothing posted: at once, and only once.
    let first = Srq::create(&ia, &pz, attr(1)).expect("srq with a watermark");
    lw_event(&first);
    super::srq::receive_consumed();
    assert!(async_evd.is_empty());
    first.free().expect("free");

    let srq = Srq::create(&ia, &pz, attr(0)).expect("srq");
    assert!(async_evd.is_empty(), "DAT_SRQ_LW_DEFAULT never fires");
    let mut buf = vec![0u8; 64];
    let lmr = Lmr::create(
        &ia,
        LmrRegion::Virtual {
            address: buf.as_mut_ptr() as u64,
            length: 64,
        },
        &pz,
        mem_priv::ALL,
        VA_TYPE_VA,
    )
    .expect("lmr");
    let seg = Sge {
        addr: buf.as_ptr() as u64,
        length: 64,
        lkey: lmr.lmr_context(),
    };
    srq.post_recv(&[seg], 1).expect("post 1");
    srq.post_recv(&[seg], 2).expect("post 2");
    // Armed at the posted count: not below it, not even when a receive elsewhere completes.
    srq.set_lw(2).expect("lw 2");
    super::srq::receive_consumed();
    assert!(async_evd.is_empty());
    // Above the posted count: during the call; set again, it fires again.
    srq.set_lw(3).expect("lw 3");
    lw_event(&srq);
    srq.set_lw(4).expect("lw 4");
    lw_event(&srq);
    super::srq::receive_consumed();
    assert!(async_evd.is_empty(), "disarmed after firing");
    assert_eq!(
        srq.set_lw(5).expect_err("above max_recv_dtos"),
        DatError::bad(Param::LowWatermark)
    );
    srq.set_lw(0).expect("lw 0");
    assert!(async_evd.is_empty());
    // Freed while armed: nothing is left to fire.
    srq.set_lw(1).expect("lw 1");
    srq.free().expect("free armed srq");
    super::srq::receive_consumed();
    assert!(async_evd.is_empty());
    ia.close(close_flags::ABRUPT).expect("close");
}
