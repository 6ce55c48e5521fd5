//! Behaviour tests of who moves a connection's data and in what order its requests complete:
//! a waiting thread that drives its connections, claims that outlive a wait, a polling
//! consumer that stops, and reads with the requests behind them (run over every device as
//! behaviour_tests.rs's others are).

use super::*;

/// A thread waiting on an EVD runs the transport for its connections itself (`drive`): what
/// arrives completes there, large payloads included; output another thread queues on those
/// connections still goes out; and software events and dat_evd_set_unwaitable still reach it.
pub(super) fn a_waiting_thread_drives_its_connections(dev: &TestDevice) {
    use crate::core::error::DatError;
    const BIG: usize = 4 << 20;
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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
/// into (its wait claims nothing). That is the path over TCP; the same-host path copies on
/// the posting thread, and its rings keep a connection out of that set; verbs has its own.
pub(super) fn a_connection_a_wait_claimed_is_served_after_the_wait(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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
pub(super) fn many_large_reads_in_flight_complete_in_order(dev: &TestDevice) {
    const MIB: usize = 1 << 20;
    const READS: usize = 12;
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    let sbuf = Buffer::new(4 * MIB);
    let cbuf = Buffer::new(READS * MIB);
    let slmr = server.register(&sbuf);
    let clmr = client.register(&cbuf);
    let pattern: Vec<u8> = (0..4 * MIB).map(|i| (i * 7 + i / 65_537) as u8).collect();
    sbuf.write(0, &pattern);
    client.buf.write(0, b"first!");
    // The receive comes after the reads were posted, except on iWARP, which has no RNR retry.
    let recv_first = client.skip_on_iwarp(
        "many_large_reads_in_flight_complete_in_order (the send's receive posted after it)",
        "iWARP has no RNR retry: a send that finds no receive ends the connection",
    );
    if recv_first {
        server
            .ep
            .post_recv(&[server.seg(0, 64)], 200, 0)
            .expect("recv");
    }
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
    if !recv_first {
        server
            .ep
            .post_recv(&[server.seg(0, 64)], 200, 0)
            .expect("recv");
    }
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

/// A polling consumer (dat_evd_dequeue) reads its connections itself (`TcpCq::progress`);
/// once it stops polling, the progress thread must still serve them: here the server
/// application calls nothing after its polling, and the client's second send can complete
/// only once the server's side has read it. (A lease that kept the progress thread off polled
/// connections for a while was tried and dropped: see `progress_loop`.)
pub(super) fn a_polling_consumer_hands_its_connections_back_when_it_stops(dev: &TestDevice) {
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
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

/// DTOs of one EP complete once each, in posting order, with their own lengths: a large RDMA
/// read completes before the writes posted behind it, though a device may finish those first
/// (soft-iWARP completes a write as soon as it is sent, a read when its response is in: the
/// backend fences the next request after a read there). A suppressed write among them is not
/// reported; nothing is reported twice or early (a read retired at a later completion was
/// reported with length 0 and took every request behind it along when its own came). A read
/// with a barrier fence is taken on every device.
pub(super) fn reads_and_the_requests_behind_them_complete_in_posting_order(dev: &TestDevice) {
    use crate::core::consts::completion_flags;
    const BIG: usize = 1 << 20;
    const ROUNDS: u64 = 4;
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    let sbuf = Buffer::new(BIG);
    let cbuf = Buffer::new(2 * BIG);
    let slmr = server.register(&sbuf);
    let clmr = client.register(&cbuf);
    let pattern: Vec<u8> = (0..BIG).map(|i| (i * 11 + i / 4099) as u8).collect();
    sbuf.write(0, &pattern);
    let cseg = |off: usize, len: usize| Sge {
        addr: cbuf.addr() + off as u64,
        length: len as u32,
        lkey: clmr.lmr_context(),
    };
    let whole = RemoteBuffer {
        address: sbuf.addr(),
        length: BIG as u32,
        rmr_context: slmr.rmr_context(),
    };
    for round in 0..ROUNDS {
        let c = round * 10;
        client.buf.write(0, &round.to_le_bytes());
        let ep = &client.ep;
        ep.post_rdma_read(&[cseg(0, BIG)], c + 1, whole, 0)
            .expect("read");
        ep.post_rdma_write(&[client.seg(0, 8)], c + 2, server.remote(0, 8), 0)
            .expect("write behind a read");
        ep.post_rdma_write(
            &[client.seg(0, 8)],
            c + 3,
            server.remote(8, 8),
            completion_flags::SUPPRESS,
        )
        .expect("suppressed write");
        // Fenced: waits for the first read (siw refuses a fenced read at the doorbell, reads
        // complete in order there, so the backend leaves the fence off).
        ep.post_rdma_read(
            &[cseg(BIG, BIG)],
            c + 4,
            whole,
            completion_flags::BARRIER_FENCE,
        )
        .expect("second read, fenced");
        ep.post_rdma_write(&[client.seg(0, 8)], c + 5, server.remote(16, 8), 0)
            .expect("write behind the second read");
        // A fenced send of three segments, too long to go inline: what the reads brought.
        server
            .ep
            .post_recv(&[server.seg(1024, 3000)], c + 7, 0)
            .expect("recv");
        let three = [
            cseg(BIG, 1000),
            cseg(BIG + 1000, 1000),
            cseg(BIG + 2000, 1000),
        ];
        ep.post_send(&three, c + 6, completion_flags::BARRIER_FENCE)
            .expect("fenced send");
        let got: Vec<(u64, u32, u32, u32)> = (0..5).map(|_| dto(&next(&client.dto))).collect();
        assert_eq!(
            got,
            vec![
                (c + 1, dto_status::SUCCESS, BIG as u32, dto_op::RDMA_READ),
                (c + 2, dto_status::SUCCESS, 8, dto_op::RDMA_WRITE),
                (c + 4, dto_status::SUCCESS, BIG as u32, dto_op::RDMA_READ),
                (c + 5, dto_status::SUCCESS, 8, dto_op::RDMA_WRITE),
                (c + 6, dto_status::SUCCESS, 3000, dto_op::SEND),
            ],
            "round {round}"
        );
        assert_eq!(
            dto(&next(&server.dto)),
            (c + 7, dto_status::SUCCESS, 3000, dto_op::RECEIVE),
            "round {round}: the fenced send's receive"
        );
        if !dev.skip_on_soft_roce(
            "reads_and_the_requests_behind_them_complete_in_posting_order (what the fenced \
             send carried)",
            "soft-RoCE lets a request with IBV_SEND_FENCE gather its data before an earlier \
             multi-packet RDMA read has landed (see fenced_requests_wait_for_earlier_reads)",
        ) {
            assert!(
                server.buf.read(1024, 3000) == pattern[..3000],
                "round {round}: the fenced send carried what the read brought"
            );
        }
        assert!(
            client.dto.dequeue().is_err(),
            "round {round}: nothing more (the suppressed write, or a request twice)"
        );
        assert!(
            cbuf.read(0, BIG) == pattern,
            "round {round}: first read's data"
        );
        assert!(
            cbuf.read(BIG, BIG) == pattern,
            "round {round}: second read's data"
        );
        for off in [0, 8, 16] {
            assert_eq!(
                server.buf.read(off, 8),
                round.to_le_bytes(),
                "round {round}: write at {off}"
            );
        }
        cbuf.write(0, &vec![0u8; 2 * BIG]);
    }
    close(&[&client, &server]);
}

/// A zero-byte RDMA read (no local segment, remote length 0) completes with length 0 behind
/// other requests, also right behind another read, suppressed or not (the "signalled marker"
/// of test_dto_rules and test_dat12_rules): what was posted before it has completed, the data
/// of a suppressed read before it is in.
pub(super) fn a_zero_byte_read_behind_other_requests_completes(dev: &TestDevice) {
    use crate::core::consts::completion_flags;
    let server = Side::on(dev, "srv", mem_priv::ALL);
    let client = Side::on(dev, "cli", mem_priv::ALL);
    let _psp = connect_pair(&server, &client);
    // The responder's bug, not ours: Linux 6.1's siw queues a read request that comes while it
    // is sending (the response to the read before) and then sends a zero-length one with the
    // length of the response before it; the initiator finds the length wrong (dmesg: "rresp
    // len: 8 != 0") and ends the connection.
    let read_before = !client.skip_on_iwarp(
        "a_zero_byte_read_behind_other_requests_completes (a zero-byte read right behind a read)",
        "siw answers a zero-byte read queued behind another read with that read's length \
         (TERMINATE)",
    );
    server.buf.write(32, b"readable");
    let empty = server.remote(0, 0);
    for (round, flags) in [0, completion_flags::SUPPRESS].into_iter().enumerate() {
        let c = round as u64 * 10;
        client.buf.write(0, b"written!");
        client.buf.write(100, &[0u8; 8]);
        client
            .ep
            .post_rdma_write(&[client.seg(0, 8)], c + 1, server.remote(64, 8), flags)
            .expect("write");
        if read_before {
            client
                .ep
                .post_rdma_read(&[client.seg(100, 8)], c + 2, server.remote(32, 8), flags)
                .expect("read");
        }
        client
            .ep
            .post_rdma_read(&[], c + 3, empty, 0)
            .expect("zero-byte read");
        if flags == 0 {
            assert_eq!(
                dto(&next(&client.dto)),
                (c + 1, dto_status::SUCCESS, 8, dto_op::RDMA_WRITE)
            );
            if read_before {
                assert_eq!(
                    dto(&next(&client.dto)),
                    (c + 2, dto_status::SUCCESS, 8, dto_op::RDMA_READ)
                );
            }
        }
        assert_eq!(
            dto(&next(&client.dto)),
            (c + 3, dto_status::SUCCESS, 0, dto_op::RDMA_READ),
            "round {round}: the zero-byte read"
        );
        assert!(client.dto.dequeue().is_err(), "round {round}: nothing more");
        if read_before {
            assert_eq!(client.buf.read(100, 8), b"readable", "round {round}");
        }
        assert_eq!(server.buf.read(64, 8), b"written!", "round {round}");
    }
    close(&[&client, &server]);
}
