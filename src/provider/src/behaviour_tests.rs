//! DAT behaviour over any device: two IAs in one process, driven through the core's API only
//! (Ia, Ep, Evd, Lmr, Rmr, Pz, Sp, Cr, Srq, Cno): connection management, data transfer, remote
//! access enforcement, and failures. Every test runs over each device of `TestDevice`
//! (testing.rs): `over_tcp::*` (the TCP backend, its same-host path off),
//! `over_samehost::*` (the same-host path required), `over_samehost_lazy::*` (the same-host
//! path as users get it: set up at a connection's first request) and, built with the verbs feature,
//! `over_verbs::*`, ignored unless asked for: those need an RDMA port, named by
//! DAPLRS_TEST_DEVICE (e.g. "verbs:rxe0:1"), and run in the soft-RoCE guest of
//! tests-c/scripts/verbs-guest.sh (`<test binary> --ignored over_verbs::`). Built with the ofi feature
//! (as `cargo test --workspace` builds this crate: daplrs-ofi asks for it), `over_ofi_tcp::*`,
//! `over_ofi_shm::*` and `over_ofi_rxm::*` run them over libfabric's tcp (connected
//! endpoints), shm and tcp;ofi_rxm (reliable datagrams under our connection layer) on
//! 127.0.0.1 (and `over_ofi_device::*`, ignored unless asked for, over the libfabric domain
//! DAPLRS_TEST_DEVICE names, e.g. "ofi:verbs;ofi_rxm:rxe0" in the guest). The datagram EP
//! tests (`datagrams`) run over the devices with datagrams alone: `datagrams_over_tcp::*`,
//! `datagrams_over_ofi_rxm_udp::*` and `datagrams_over_ofi_shm_udp::*` (libfabric's udp beside
//! tcp;ofi_rxm and shm). What a device cannot do is skipped on it alone, from what its attributes say
//! (no memory windows, no SRQs, iWARP), with the reason printed. Never silent.
//!
//! The TCP backend's own tests (its wire protocol, hostile peers, the same-host rings and
//! arenas, engine internals) stay in daplrs-tcp: src/backend-tcp/src/tests.rs and its tests/ directory.

use crate::backend::Sge;
use crate::core::consts::{close_flags, dto_op, dto_status, evd_flags, event_number, mem_priv};
use crate::core::ep::{Ep, EpModify, EpState, RemoteBuffer};
use crate::core::error::{ErrorType, SubType};
use crate::core::evd::{Evd, EventData};
use crate::core::handle::{self, Handle};
use crate::core::lmr::VA_TYPE_VA;
use crate::core::rmr::Rmr;
use crate::core::sp::Sp;
use crate::testing::{
    bad_rkey_write_breaks_the_connection, close, connect_pair, dto, next, next_cr,
    out_of_range_read_breaks_the_connection, read_8_bytes, until_waiting, Buffer, Side, TestDevice,
    GUARD_US,
};
use std::sync::Arc;

mod progress;
use progress::*;

mod datagrams;
use datagrams::*;

/// Instantiates each datagram test once per device with datagram EPs: the TCP backend, and
/// libfabric's udp beside tcp;ofi_rxm and beside shm (`dgram=udp`).
macro_rules! over_datagram_devices {
    ($($test:ident),* $(,)?) => {
        mod datagrams_over_tcp {
            $(#[test]
            fn $test() {
                super::$test(&super::TestDevice::Tcp)
            })*
        }
        #[cfg(feature = "ofi")]
        mod datagrams_over_ofi_rxm_udp {
            $(#[test]
            fn $test() {
                super::$test(&super::TestDevice::Ofi("tcp;ofi_rxm 127.0.0.1 dgram=udp".into()))
            })*
        }
        #[cfg(feature = "ofi")]
        mod datagrams_over_ofi_shm_udp {
            $(#[test]
            fn $test() {
                super::$test(&super::TestDevice::Ofi("shm 127.0.0.1 dgram=udp".into()))
            })*
        }
    };
}

over_datagram_devices!(
    datagram_eps_resolve_and_carry_datagrams,
    a_rejected_resolution_says_so,
);

/// Instantiates each behaviour test once per device: a module per device, a `#[test]` per
/// test in it, named as the test.
macro_rules! over_every_device {
    ($($test:ident),* $(,)?) => {
        mod over_tcp {
            $(#[test]
            fn $test() {
                super::$test(&super::TestDevice::Tcp)
            })*
        }
        mod over_samehost {
            $(#[test]
            fn $test() {
                super::$test(&super::TestDevice::SameHost)
            })*
        }
        mod over_samehost_lazy {
            $(#[test]
            fn $test() {
                super::$test(&super::TestDevice::SameHostLazy)
            })*
        }
        #[cfg(feature = "verbs")]
        mod over_verbs {
            $(#[test]
            #[ignore = "needs an RDMA port: DAPLRS_TEST_DEVICE=verbs:<device>:<port>, --ignored"]
            fn $test() {
                let dev = super::TestDevice::from_env();
                assert!(dev.is_verbs(), "over_verbs::* run on {dev:?}: set DAPLRS_TEST_DEVICE=verbs:<device>:<port>");
                super::$test(&dev)
            })*
        }
        /// A libfabric domain of the soft-RoCE guest ("ofi:verbs;ofi_rxm:rxe0").
        #[cfg(feature = "ofi")]
        mod over_ofi_device {
            $(#[test]
            #[ignore = "needs a libfabric domain: DAPLRS_TEST_DEVICE=ofi:<provider>:<place>, --ignored"]
            fn $test() {
                let dev = super::TestDevice::from_env();
                assert!(dev.is_ofi(), "over_ofi_device::* run on {dev:?}: set DAPLRS_TEST_DEVICE=ofi:<provider>:<place>");
                super::$test(&dev)
            })*
        }
        #[cfg(feature = "ofi")]
        mod over_ofi_tcp {
            $(#[test]
            fn $test() {
                super::$test(&super::TestDevice::Ofi("tcp 127.0.0.1".into()))
            })*
        }
        #[cfg(feature = "ofi")]
        mod over_ofi_shm {
            $(#[test]
            fn $test() {
                super::$test(&super::TestDevice::Ofi("shm 127.0.0.1".into()))
            })*
        }
        #[cfg(feature = "ofi")]
        mod over_ofi_rxm {
            $(#[test]
            fn $test() {
                super::$test(&super::TestDevice::Ofi("tcp;ofi_rxm 127.0.0.1".into()))
            })*
        }
    };
}

over_every_device!(
    send_and_receive_with_multi_segment_iovs,
    rdma_write_and_read_are_served_by_the_target,
    remote_access_violation_breaks_the_connection,
    out_of_range_and_missing_privilege_are_refused_by_the_target,
    graceful_disconnect_flushes_receives,
    peer_that_vanishes_gives_broken_and_flushes,
    reject_and_unreachable_ports,
    rmr_bind_exposes_part_of_an_lmr,
    srq_feeds_receives_of_several_connections,
    rsp_dup_connect_and_handoff,
    graceful_disconnect_lets_outstanding_requests_finish,
    completions_trigger_the_cno,
    large_transfers_arrive_intact,
    provider_created_ep_is_configured_then_accepted,
    abrupt_disconnect_flushes_at_once,
    an_overflowing_evd_keeps_every_completion_and_reports_once,
    an_evd_overrun_nobody_reads_is_reported_as_it_happens,
    fenced_requests_wait_for_earlier_reads,
    rmr_bind_on_a_disconnected_ep_is_flushed_and_leaves_it_unbound,
    a_waiting_thread_drives_its_connections,
    a_connection_a_wait_claimed_is_served_after_the_wait,
    many_large_reads_in_flight_complete_in_order,
    a_polling_consumer_hands_its_connections_back_when_it_stops,
    reads_and_the_requests_behind_them_complete_in_posting_order,
    a_zero_byte_read_behind_other_requests_completes,
);

fn send_and_receive_with_multi_segment_iovs(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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
    if !client.skip_on_iwarp(
        "send_and_receive_with_multi_segment_iovs (sends posted before their receives)",
        "iWARP has no RNR retry: a send that finds no receive ends the connection",
    ) {
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
    }

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

fn rdma_write_and_read_are_served_by_the_target(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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

    // Read fills front segments completely; a device that reads into one segment (siw)
    // refuses two at once.
    let two = [client.seg(500, 6), client.seg(600, 100)];
    if client.read_segments() < 2 {
        println!(
            "SKIP rdma_write_and_read_are_served_by_the_target (a read into 2 segments) on {}: \
             it reads into {}",
            client.ia.device().name(),
            client.read_segments()
        );
        let e = client
            .ep
            .post_rdma_read(&two, 2, server.remote(1000, 18), 0)
            .expect_err("read into more segments than the device fills");
        assert_eq!(e.kind, ErrorType::InvalidParameter);
        client
            .ep
            .post_rdma_read(&two[..1], 2, server.remote(1000, 6), 0)
            .expect("read");
        assert_eq!(
            dto(&next(&client.dto)),
            (2, dto_status::SUCCESS, 6, dto_op::RDMA_READ)
        );
        assert_eq!(client.buf.read(500, 6), b"server");
    } else {
        client
            .ep
            .post_rdma_read(&two, 2, server.remote(1000, 18), 0)
            .expect("read");
        assert_eq!(
            dto(&next(&client.dto)),
            (2, dto_status::SUCCESS, 18, dto_op::RDMA_READ)
        );
        assert_eq!(client.buf.read(500, 6), b"server");
        assert_eq!(client.buf.read(600, 12), b"-owned bytes");
        assert_eq!(client.buf.read(612, 4), vec![0u8; 4]);
    }

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

fn remote_access_violation_breaks_the_connection(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    if client.skip_on_iwarp(
        "remote_access_violation_breaks_the_connection",
        "iWARP reports a write's violation asynchronously (TERMINATE), not on the write",
    ) {
        close(&[&client, &server]);
        return;
    }
    bad_rkey_write_breaks_the_connection(&server, &client);
    assert_eq!(client.ep.state(), EpState::Disconnected);

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
    assert_eq!(client.ep.state(), EpState::Unconnected);
    close(&[&client, &server]);
}

fn out_of_range_and_missing_privilege_are_refused_by_the_target(dev: &TestDevice) {
    // The target's LMR grants remote read only.
    let server = Side::on(
        dev,
        "srv",
        mem_priv::LOCAL_READ | mem_priv::LOCAL_WRITE | mem_priv::REMOTE_READ,
    );
    let client = Side::on(dev, "cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    if client.skip_on_iwarp(
        "out_of_range_and_missing_privilege_are_refused_by_the_target",
        "siw flushes a read its target refused and completes a refused write as sent: the \
         target's TERMINATE ends the connection instead (RFC 5040), no REMOTE_ACCESS",
    ) {
        close(&[&client, &server]);
        return;
    }
    out_of_range_read_breaks_the_connection(&server, &client);

    let server2 = Side::on(
        dev,
        "srv2",
        mem_priv::LOCAL_READ | mem_priv::LOCAL_WRITE | mem_priv::REMOTE_READ,
    );
    let client2 = Side::on(dev, "cli2", mem_priv::ALL);
    let _psp2 = connect_pair(&server2, &client2);
    client2
        .ep
        .post_rdma_write(&[client2.seg(0, 8)], 2, server2.remote(0, 8), 0)
        .expect("post write");
    assert_eq!(dto(&next(&client2.dto)).1, dto_status::REMOTE_ACCESS);
    assert_eq!(server2.buf.read(0, 8), vec![0u8; 8]);
    close(&[&client, &server, &client2, &server2]);
}

fn graceful_disconnect_flushes_receives(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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
    assert_eq!(server.ep.state(), EpState::Disconnected);
    client
        .ep
        .disconnect(close_flags::GRACEFUL)
        .expect("disconnect again is a no-op");
    close(&[&client, &server]);
}

fn peer_that_vanishes_gives_broken_and_flushes(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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

fn reject_and_unreachable_ports(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
    let (psp, port) = Sp::create_psp_any(&server.ia, &server.cr, 0).expect("psp");
    client
        .ep
        .connect(server.addr(), port, GUARD_US, b"let me in", 0, 0)
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
    let EventData::Connection {
        ref private_data, ..
    } = ev.data
    else {
        panic!("{ev:?}")
    };
    client.assert_private_data(private_data, b"go away");
    assert_eq!(client.ep.state(), EpState::Disconnected);
    client.ep.reset().expect("reset");

    // Nobody listens on a port we just released.
    psp.free().expect("free psp");
    client
        .ep
        .connect(server.addr(), port, GUARD_US, b"", 0, 0)
        .expect("connect");
    assert_eq!(
        next(&client.conn).number,
        event_number::CONNECTION_NON_PEER_REJECTED
    );

    // Connect is refused synchronously outside UNCONNECTED.
    let e = client
        .ep
        .connect(server.addr(), port, GUARD_US, b"", 0, 0)
        .expect_err("disconnected");
    assert_eq!(
        (e.kind, e.sub),
        (ErrorType::InvalidState, SubType::EpDisconnected)
    );
    close(&[&client, &server]);
}

fn rmr_bind_exposes_part_of_an_lmr(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    if server.skip_without_rmrs("rmr_bind_exposes_part_of_an_lmr") {
        close(&[&client, &server]);
        return;
    }
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

    if dev.skip_on_soft_roce(
        "rmr_bind_exposes_part_of_an_lmr (an access outside the window)",
        "soft-RoCE checks an access through a memory window against the range of the window's \
         memory region, not the window's (rxe_resp.c check_rkey: mr_check_range on mw->mr)",
    ) {
        rmr.free().expect("free rmr");
        close(&[&client, &server]);
        return;
    }
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

fn srq_feeds_receives_of_several_connections(dev: &TestDevice) {
    use crate::core::srq::{Srq, SrqAttr};
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let c1 = Side::on(dev, "c1", mem_priv::ALL);
    let c2 = Side::on(dev, "c2", mem_priv::ALL);
    let attr = SrqAttr {
        max_recv_dtos: 8,
        max_recv_iov: 1,
        low_watermark: 0,
    };
    if server.skip_without_srqs("srq_feeds_receives_of_several_connections") {
        assert!(Srq::create(&server.ia, &server.pz, attr).is_err());
        return;
    }
    let srq = Srq::create(&server.ia, &server.pz, attr).expect("srq");
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
            .connect(server.addr(), port, GUARD_US, b"", 0, 0)
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

fn rsp_dup_connect_and_handoff(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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
    assert_eq!(server.ep.state(), EpState::Reserved);
    client
        .ep
        .connect(server.addr(), port, GUARD_US, b"rsp", 0, 0)
        .expect("connect");
    let cr = next_cr(&server.cr);
    assert_eq!(cr.query().ep, server.ep.handle());
    assert_eq!(server.ep.state(), EpState::TentativeConnectionPending);
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
        .connect(server.addr(), port1, GUARD_US, b"handoff", 0, 0)
        .expect("connect");
    let cr = next_cr(&server.cr);
    cr.handoff(port2).expect("handoff");
    let ev = next(&server.cr);
    let EventData::CrArrival { cr, sp, .. } = ev.data else {
        panic!("{ev:?}")
    };
    assert_eq!(sp, psp2.handle());
    let cr = handle::cr(cr).expect("cr");
    server.assert_private_data(&cr.query().private_data, b"handoff");
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

fn graceful_disconnect_lets_outstanding_requests_finish(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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

fn completions_trigger_the_cno(dev: &TestDevice) {
    use crate::core::cno::Cno;
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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

fn large_transfers_arrive_intact(dev: &TestDevice) {
    const BIG: usize = 4 << 20;
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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

fn provider_created_ep_is_configured_then_accepted(dev: &TestDevice) {
    use crate::core::ep::EpModify;
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
    let (_psp, port) = Sp::create_psp_any(
        &server.ia,
        &server.cr,
        crate::core::consts::psp_flags::PROVIDER,
    )
    .expect("psp");
    client
        .ep
        .connect(server.addr(), port, GUARD_US, b"", 0, 0)
        .expect("connect");
    let cr = next_cr(&server.cr);
    let ep = handle::ep(cr.query().ep).expect("provider-created EP");
    assert_eq!(ep.state(), EpState::UnconfiguredTentative);
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
    assert_eq!(ep.state(), EpState::TentativeConnectionPending);
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

fn abrupt_disconnect_flushes_at_once(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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

fn an_overflowing_evd_keeps_every_completion_and_reports_once(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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

/// Receives complete into an EVD of two entries that nobody reads: its overflow is an
/// asynchronous error the consumer waits for on the async EVD, not something it learns when
/// it next reads the small one (over verbs, where a polled CQ raises no events, the CQ asks
/// for them while its QPs may have more outstanding than the EVD holds). Every completion
/// is still there afterwards, in order.
fn an_evd_overrun_nobody_reads_is_reported_as_it_happens(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
    let small = Evd::create(&server.ia, 2, None, evd_flags::DTO).expect("small evd");
    server
        .ep
        .modify(EpModify {
            recv_evd: Some(Some(small.clone())),
            ..EpModify::default()
        })
        .expect("small receive EVD");
    let _psp = connect_pair(&server, &client);
    let async_evd = server.ia.async_evd().expect("async evd");
    for i in 0..4u64 {
        server
            .ep
            .post_recv(&[server.seg(8 * i as usize, 8)], i, 0)
            .expect("recv");
    }
    for i in 0..4u64 {
        client
            .ep
            .post_send(&[client.seg(8 * i as usize, 8)], 10 + i, 0)
            .expect("send");
    }
    for i in 0..4u64 {
        assert_eq!(
            dto(&next(&client.dto)),
            (10 + i, dto_status::SUCCESS, 8, dto_op::SEND)
        );
    }
    assert_eq!(next(&async_evd).number, event_number::ASYNC_EVD_OVERFLOW);
    for i in 0..4u64 {
        let ev = small.dequeue().expect("kept");
        assert_eq!(dto(&ev), (i, dto_status::SUCCESS, 8, dto_op::RECEIVE));
    }
    assert_eq!(
        async_evd.dequeue().expect_err("reported once").kind,
        ErrorType::QueueEmpty
    );
    close(&[&client, &server]);
}

/// DAT_COMPLETION_BARRIER_FENCE_FLAG: a send or RDMA write fenced behind an RDMA read into its
/// source buffer carries what the read brought, not what was there when it was posted; and
/// what is posted after a waiting request waits behind it (completions stay in post order).
fn fenced_requests_wait_for_earlier_reads(dev: &TestDevice) {
    use crate::core::consts::completion_flags;
    const BIG: usize = 4 << 20;
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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
    if dev.skip_on_soft_roce(
        "fenced_requests_wait_for_earlier_reads (what the fenced requests carried)",
        "soft-RoCE lets a request with IBV_SEND_FENCE (which we set) gather its data before \
         an earlier multi-packet RDMA read has landed (seen on the guest's kernel 6.1: zeros \
         sent; a one-packet read is fenced, see tests-c/programs/test_dto_rules.c)",
    ) {
        close(&[&client, &server]);
        return;
    }
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
fn rmr_bind_on_a_disconnected_ep_is_flushed_and_leaves_it_unbound(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    if client.skip_without_rmrs("rmr_bind_on_a_disconnected_ep_is_flushed_and_leaves_it_unbound") {
        close(&[&client, &server]);
        return;
    }
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
    assert_eq!(client.ep.state(), EpState::Disconnected);

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
