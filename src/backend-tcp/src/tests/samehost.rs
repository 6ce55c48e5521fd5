//! The same-host path (samehost/): RDMA reads and writes between two IAs of this process
//! (cross-memory attach to our own pid) complete on the posting thread, and every refusal
//! (bad key, range, privilege, a deregistered region) gives exactly what TCP gives, because
//! the request then goes over TCP and the target decides. Devices take their mode from the
//! test (`test_hooks::open_with`), not from DAPLRS_SAME_HOST: tests run in parallel threads.

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::samehost::{test_hooks, Mode, Stats};
use super::{close, connect_pair, dto, next, Side, GUARD_US};
use daplrs_core::consts::{dto_op, dto_status, event_number, mem_priv};
use daplrs_core::ep::EpState;
use daplrs_core::evd::EventData;

fn side(name: &str, privileges: u32, mode: Mode) -> (Side, Arc<Stats>) {
    let (s, mut stats) = test_hooks::open_with(mode, || Side::new(name, privileges));
    assert_eq!(stats.len(), 1, "one device per IA");
    (s, stats.remove(0))
}

fn inline(stats: &Stats) -> u64 {
    stats.inline_ops.load(Ordering::Relaxed)
}

// The send-order tests' layout: message `i` is 8 bytes `b'a' + i` at client offset 100 * i,
// sent with cookie 10 + i; receive `r` is 8 bytes at server offset 1000 + 8 * r, cookie 20 + r.

fn post_recvs(server: &Side, rs: std::ops::Range<u64>) {
    for r in rs {
        server
            .ep
            .post_recv(&[server.seg(1000 + 8 * r as usize, 8)], 20 + r, 0)
            .expect("recv");
    }
}

fn post_sends(client: &Side, is: std::ops::Range<u64>) {
    for i in is {
        client
            .ep
            .post_send(&[client.seg(100 * i as usize, 8)], 10 + i, 0)
            .expect("send");
    }
}

/// Receives `rs` completed in order, each with its own message.
fn expect_received(server: &Side, rs: std::ops::Range<u64>) {
    for r in rs {
        assert_eq!(
            dto(&next(&server.dto)),
            (20 + r, dto_status::SUCCESS, 8, dto_op::RECEIVE)
        );
        assert_eq!(
            server.buf.read(1000 + 8 * r as usize, 8),
            [b'a' + r as u8; 8]
        );
    }
}

/// Sends `is` completed in order.
fn expect_sent(client: &Side, is: std::ops::Range<u64>) {
    for i in is {
        assert_eq!(dto(&next(&client.dto)).0, 10 + i);
    }
}

fn mapped(stats: &Stats) -> u64 {
    stats.mapped_ops.load(Ordering::Relaxed)
}

fn attached(stats: &Stats) -> u64 {
    stats.attached.load(Ordering::Relaxed)
}

fn rings(stats: &Stats) -> u64 {
    stats.rings.load(Ordering::Relaxed)
}

fn declined(stats: &Stats) -> u64 {
    stats.declined.load(Ordering::Relaxed)
}

/// The client's offer was queued before anything it sends: once a send from the client has
/// arrived, the server has checked the offer.
fn sync_server(server: &Side, client: &Side) {
    server
        .ep
        .post_recv(&[server.seg(3000, 8)], 900, 0)
        .expect("recv");
    client
        .ep
        .post_send(&[client.seg(3000, 8)], 901, 0)
        .expect("send");
    assert_eq!(dto(&next(&server.dto)).0, 900);
    assert_eq!(dto(&next(&client.dto)).0, 901);
}

#[test]
fn reads_and_writes_complete_before_the_post_returns() {
    let (server, s_stats) = side("srv", mem_priv::ALL, Mode::Require);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    assert_eq!(
        attached(&c_stats),
        1,
        "the client mapped the server's table"
    );
    sync_server(&server, &client);
    assert_eq!(
        attached(&s_stats),
        1,
        "the server mapped the client's table"
    );

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
    // Already there: no wait, no progress thread involved.
    let ev = client
        .dto
        .dequeue()
        .expect("completed before the post returned");
    assert_eq!(dto(&ev), (1, dto_status::SUCCESS, 21, dto_op::RDMA_WRITE));
    assert_eq!(server.buf.read(2000, 21), b"written by the client");

    client
        .ep
        .post_rdma_read(
            &[client.seg(500, 6), client.seg(600, 100)],
            2,
            server.remote(1000, 18),
            0,
        )
        .expect("read");
    let ev = client
        .dto
        .dequeue()
        .expect("completed before the post returned");
    assert_eq!(dto(&ev), (2, dto_status::SUCCESS, 18, dto_op::RDMA_READ));
    assert_eq!(client.buf.read(500, 6), b"server");
    assert_eq!(client.buf.read(600, 12), b"-owned bytes");
    assert_eq!(client.buf.read(612, 4), vec![0u8; 4]);
    // The write and the read, and sync_server's send, placed in the server's receive.
    assert_eq!(inline(&c_stats), 3);
    // By cross-memory attach: registration moves no pages (see the next test).
    assert_eq!(mapped(&c_stats), 0);

    // The passive side uses it too.
    client.buf.write(800, b"from the client");
    server
        .ep
        .post_rdma_read(&[server.seg(1500, 15)], 3, client.remote(800, 15), 0)
        .expect("server read");
    let ev = server
        .dto
        .dequeue()
        .expect("completed before the post returned");
    assert_eq!(dto(&ev), (3, dto_status::SUCCESS, 15, dto_op::RDMA_READ));
    assert_eq!(server.buf.read(1500, 15), b"from the client");
    assert_eq!(inline(&s_stats), 1);

    // A read behind an outstanding send goes over TCP (completion order), and still works:
    // the send has no receive yet, so it travels through the ring and waits there.
    client
        .ep
        .post_send(&[client.seg(3100, 8)], 4, 0)
        .expect("send");
    client
        .ep
        .post_rdma_read(&[client.seg(700, 4)], 5, server.remote(1000, 4), 0)
        .expect("read behind a send");
    assert!(
        client.dto.dequeue().is_err(),
        "the send waits for a receive"
    );
    server
        .ep
        .post_recv(&[server.seg(3100, 8)], 910, 0)
        .expect("recv");
    assert_eq!(dto(&next(&client.dto)).0, 4);
    assert_eq!(
        dto(&next(&client.dto)),
        (5, dto_status::SUCCESS, 4, dto_op::RDMA_READ)
    );
    assert_eq!(client.buf.read(700, 4), b"serv");
    assert_eq!(dto(&next(&server.dto)).0, 910);
    close(&[&client, &server]);
}

/// A send to a receive the receiver has posted is placed in it by the sender, before the
/// post returns: the receiver's memory holds the message while the receiver has called
/// nothing (a program spinning on its buffer sees it at once), and the receive completes,
/// once, when the receiver next looks.
#[test]
fn a_send_lands_in_the_receive_before_the_receiver_looks() {
    let (server, _) = side("srv", mem_priv::ALL, Mode::Require);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    sync_server(&server, &client);
    let before = inline(&c_stats);
    server
        .ep
        .post_recv(&[server.seg(2000, 10), server.seg(2100, 30)], 77, 0)
        .expect("recv");
    client
        .buf
        .write(0, b"placed by the sender, no CPU of yours");
    client
        .ep
        .post_send(&[client.seg(0, 16), client.seg(16, 21)], 5, 0)
        .expect("send");
    let ev = client
        .dto
        .dequeue()
        .expect("completed before the post returned");
    assert_eq!(dto(&ev), (5, dto_status::SUCCESS, 37, dto_op::SEND));
    assert_eq!(inline(&c_stats), before + 1);
    // The receiver has not looked since it posted: the data is there all the same.
    assert_eq!(server.buf.read(2000, 10), b"placed by ");
    assert_eq!(server.buf.read(2100, 27), b"the sender, no CPU of yours");
    assert_eq!(
        server.buf.read(2127, 3),
        vec![0u8; 3],
        "nothing past the message"
    );
    assert_eq!(
        dto(&next(&server.dto)),
        (77, dto_status::SUCCESS, 37, dto_op::RECEIVE)
    );
    assert!(server.dto.dequeue().is_err(), "completed once");
    close(&[&client, &server]);
}

/// Sends placed by the sender and a send that travels through the ring (no receive posted
/// yet) take the receives in post order, each once.
#[test]
fn placed_and_ringed_sends_keep_their_order() {
    let (server, _) = side("srv", mem_priv::ALL, Mode::Require);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    sync_server(&server, &client);
    let before = inline(&c_stats);
    for i in 0..4u8 {
        client.buf.write(100 * i as usize, &[b'a' + i; 8]);
    }
    // Through the ring: nothing posted yet.
    post_sends(&client, 0..1);
    assert_eq!(inline(&c_stats), before);
    post_recvs(&server, 0..4);
    expect_sent(&client, 0..1);
    // Nothing outstanding now: placed, in receives 1 to 3.
    post_sends(&client, 1..4);
    assert_eq!(inline(&c_stats), before + 3);
    expect_sent(&client, 1..4);
    expect_received(&server, 0..4);
    assert!(server.dto.dequeue().is_err(), "each receive completed once");
    assert!(client.dto.dequeue().is_err(), "each send completed once");
    close(&[&client, &server]);
}

/// Sends the QP's lane placed (engine/lane.rs), then sends that find no receive published
/// and go through the engine and the ring: the lane hands the engine the number of the
/// peer's next receive, so every message takes its own receive, in post order.
#[test]
fn sends_the_lane_placed_and_the_engine_sent_keep_their_order() {
    let (server, _) = side("srv", mem_priv::ALL, Mode::Require);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    sync_server(&server, &client);
    for i in 0..8u8 {
        client.buf.write(100 * i as usize, &[b'a' + i; 8]);
    }
    post_recvs(&server, 0..3);
    let before = inline(&c_stats);
    // The first opens the lane, the next two go by it: placed, completed at once.
    post_sends(&client, 0..3);
    assert_eq!(inline(&c_stats), before + 3, "placed");
    expect_sent(&client, 0..3);
    // No receive published: through the ring, after the placed ones.
    post_sends(&client, 3..6);
    assert_eq!(inline(&c_stats), before + 3, "not placed");
    post_recvs(&server, 3..6);
    expect_received(&server, 0..6);
    expect_sent(&client, 3..6);
    // Nothing outstanding again: placed in the receives that follow, the right ones.
    post_recvs(&server, 6..8);
    post_sends(&client, 6..8);
    assert_eq!(inline(&c_stats), before + 5, "placed again");
    expect_received(&server, 6..8);
    expect_sent(&client, 6..8);
    assert!(server.dto.dequeue().is_err(), "each receive completed once");
    assert!(client.dto.dequeue().is_err(), "each send completed once");
    close(&[&client, &server]);
}

/// A receive too small for the message is not placed in: the send travels through the ring
/// and the receiver reports what DAT specifies (a local length error on the receive, the
/// send refused, the connection broken), as over TCP.
#[test]
fn a_receive_too_small_is_refused_as_over_tcp() {
    let (server, _) = side("srv", mem_priv::ALL, Mode::Require);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    sync_server(&server, &client);
    let before = inline(&c_stats);
    server
        .ep
        .post_recv(&[server.seg(0, 8)], 30, 0)
        .expect("recv");
    client
        .ep
        .post_send(&[client.seg(0, 16)], 31, 0)
        .expect("send");
    assert_eq!(inline(&c_stats), before, "not placed");
    assert_eq!(
        dto(&next(&server.dto)),
        (30, dto_status::LOCAL_LENGTH, 0, dto_op::RECEIVE)
    );
    let (cookie, status, ..) = dto(&next(&client.dto));
    assert_eq!(cookie, 31);
    assert_ne!(status, dto_status::SUCCESS);
    assert_eq!(next(&client.conn).number, event_number::CONNECTION_BROKEN);
    close(&[&client, &server]);
}

/// A receiver whose receives are flushed (its EP disconnected) completes the ones the sender
/// had placed messages in (the sender completed those sends) and flushes the rest; and once
/// the flush is done, no send lands in those buffers any more.
#[test]
fn a_flush_completes_placed_receives_and_withdraws_the_rest() {
    let (server, _) = side("srv", mem_priv::ALL, Mode::Require);
    let (client, _) = side("cli", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    sync_server(&server, &client);
    server
        .ep
        .post_recv(&[server.seg(0, 8)], 40, 0)
        .expect("recv 0");
    server
        .ep
        .post_recv(&[server.seg(8, 8)], 41, 0)
        .expect("recv 1");
    client.buf.write(0, b"message!");
    client
        .ep
        .post_send(&[client.seg(0, 8)], 50, 0)
        .expect("send");
    assert_eq!(
        dto(&client.dto.dequeue().expect("placed")),
        (50, dto_status::SUCCESS, 8, dto_op::SEND)
    );
    // The receiver frees its EP without having looked: receive 0 holds a message.
    server.ep.free().expect("free the receiver's EP");
    let mut got = vec![dto(&next(&server.dto)), dto(&next(&server.dto))];
    got.sort();
    assert_eq!(
        got,
        vec![
            (40, dto_status::SUCCESS, 8, dto_op::RECEIVE),
            (41, dto_status::FLUSHED, 0, dto_op::RECEIVE)
        ]
    );
    assert_eq!(server.buf.read(0, 8), b"message!");
    server.buf.write(8, b"canary!!");
    let _ = client.ep.post_send(&[client.seg(0, 8)], 51, 0);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        server.buf.read(8, 8),
        b"canary!!",
        "nothing placed after the flush"
    );
    close(&[&client, &server]);
}

/// A sender placing messages as fast as it can while the receiver frees its EP: every
/// receive completes once, the placed ones first and with their data, the rest flushed; and
/// no message lands in a flushed receive's buffer after the free returned.
#[test]
fn placements_racing_a_flush_never_write_a_flushed_receive() {
    for round in 0..10u64 {
        let (server, _) = side("srv", mem_priv::ALL, Mode::Require);
        let (client, _) = side("cli", mem_priv::ALL, Mode::Require);
        let _psp = connect_pair(&server, &client);
        sync_server(&server, &client);
        for r in 0..32u64 {
            server
                .ep
                .post_recv(&[server.seg(16 * r as usize, 16)], r, 0)
                .expect("recv");
        }
        client.buf.write(0, &[0xab; 16]);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (ep, evd, sge) = (client.ep.clone(), client.dto.clone(), client.seg(0, 16));
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut id = 1000;
                while !stop.load(Ordering::Relaxed) {
                    if ep.post_send(std::slice::from_ref(&sge), id, 0).is_ok() {
                        id += 1;
                    }
                    while evd.dequeue().is_ok() {}
                }
            });
            std::thread::sleep(Duration::from_micros(100 * round));
            server.ep.free().expect("free the receiver's EP");
            let mut events: Vec<_> = (0..32).map(|_| dto(&next(&server.dto))).collect();
            events.sort();
            let placed = events
                .iter()
                .take_while(|e| e.1 == dto_status::SUCCESS)
                .count();
            for (r, e) in events.iter().enumerate() {
                assert_eq!(e.0, r as u64, "round {round}: each receive once");
                if r < placed {
                    assert_eq!(*e, (r as u64, dto_status::SUCCESS, 16, dto_op::RECEIVE));
                    assert_eq!(server.buf.read(16 * r, 16), [0xab; 16]);
                } else {
                    assert_eq!(e.1, dto_status::FLUSHED, "round {round}: receive {r}");
                    server.buf.write(16 * r, &[0x5a; 16]);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
            for r in placed..32 {
                assert_eq!(
                    server.buf.read(16 * r, 16),
                    [0x5a; 16],
                    "round {round}: receive {r} written after its flush"
                );
            }
            stop.store(true, Ordering::Relaxed);
        });
        close(&[&client, &server]);
    }
}

/// Sends (and everything else that is not an inline read or write) travel through the
/// receivers' rings in both directions, in order, also messages several times a ring's size
/// and more than a ring of small ones in flight; the server's frames arrive the same way.
/// Registered memory a peer copies through often moves into an arena (daplrs_backend::arena) on
/// its owner's keeper thread, at the peer's request, and the peer then copies through its
/// mapping; not before the copies by cross-memory attach have cost about what the move does.
/// The data stays whole throughout, and the pages are private again once deregistered.
#[test]
fn memory_peers_copy_through_often_moves_into_an_arena() {
    let (server, _) = side("srv", mem_priv::ALL, Mode::Require);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut before_mapped = 0u64;
    for round in 0u64.. {
        let word = round.to_le_bytes();
        server.buf.write(1000, &word);
        client
            .ep
            .post_rdma_read(&[client.seg(0, 8)], round, server.remote(1000, 8), 0)
            .expect("read");
        assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);
        assert_eq!(client.buf.read(0, 8), word, "round {round}");
        if mapped(&c_stats) > 0 {
            break;
        }
        before_mapped = inline(&c_stats);
        assert!(Instant::now() < deadline, "not mapped after {round} reads");
    }
    assert!(
        before_mapped >= 200,
        "mapped after {before_mapped} reads: moving pages costs hundreds of reads'"
    );
    // Writes land through the mapping, where the owner sees them.
    client.buf.write(100, b"through the arena");
    client
        .ep
        .post_rdma_write(&[client.seg(100, 17)], 7, server.remote(2000, 17), 0)
        .expect("write");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);
    assert_eq!(server.buf.read(2000, 17), b"through the arena");
    let mapped_now = mapped(&c_stats);
    assert!(mapped_now >= 2);
    let (addr, len) = (server.buf.addr(), server.buf.len() as u64);
    assert!(!daplrs_backend::arena::is_private(addr, len));
    server.lmr.free().expect("free");
    assert!(
        daplrs_backend::arena::is_private(addr, len),
        "private again once deregistered"
    );
    assert_eq!(server.buf.read(2000, 17), b"through the arena");
    close(&[&client, &server]);
}

/// A region freed while its pages move into an arena (the peer's request just made): the
/// free waits for the move and returns with the memory private again, whatever the moment.
#[test]
fn a_region_freed_while_its_pages_move_is_private_when_the_free_returns() {
    let (server, _) = side("srv", mem_priv::ALL, Mode::Require);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    let msg = super::Buffer::new(64 << 10);
    let (addr, len) = (msg.addr(), msg.len() as u64);
    let mut mapped_rounds = 0;
    for round in 0..40u64 {
        msg.write(0, &round.to_le_bytes());
        let lmr = server.register(&msg);
        let remote = daplrs_core::ep::RemoteBuffer {
            address: addr,
            length: 8,
            rmr_context: lmr.rmr_context(),
        };
        // Past the point where the client asks (worth_mapping: 384 for 64 KiB), by a
        // varying few: the free lands before, during or after the move.
        let before = mapped(&c_stats);
        for i in 0..384 + round % 8 {
            client
                .ep
                .post_rdma_read(&[client.seg(0, 8)], i, remote, 0)
                .expect("read");
            assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);
            assert_eq!(client.buf.read(0, 8), round.to_le_bytes());
        }
        std::thread::sleep(Duration::from_micros(50 * (round % 5)));
        lmr.free().expect("free");
        assert!(
            daplrs_backend::arena::is_private(addr, len),
            "round {round}: still in an arena after the free returned"
        );
        assert_eq!(
            msg.read(0, 8),
            round.to_le_bytes(),
            "round {round}: bytes kept"
        );
        if mapped(&c_stats) > before {
            mapped_rounds += 1;
        }
    }
    // Not a timing claim: the client's own reads keep the keeper from being starved forever.
    eprintln!("{mapped_rounds} of 40 rounds read through the arena before the free");
    close(&[&client, &server]);
}

/// Memory registered for one transfer (a message layer's rendezvous: register, one RDMA
/// write or read, free, the same buffer again) never moves: each round costs what
/// cross-memory attach does, and the buffer stays the application's private memory.
#[test]
fn memory_registered_per_message_never_moves() {
    let (server, _) = side("srv", mem_priv::ALL, Mode::Require);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    let msg = super::Buffer::new(4096);
    let (addr, len) = (msg.addr(), msg.len() as u64);
    for round in 0..600u64 {
        let lmr = server.register(&msg);
        let remote = daplrs_core::ep::RemoteBuffer {
            address: addr,
            length: 4096,
            rmr_context: lmr.rmr_context(),
        };
        let fill = [round as u8; 4096];
        client.buf.write(0, &fill);
        let (op, id) = if round % 2 == 0 {
            ("write", 2 * round)
        } else {
            ("read", 2 * round + 1)
        };
        if op == "write" {
            client
                .ep
                .post_rdma_write(&[client.seg(0, 4096)], id, remote, 0)
        } else {
            msg.write(0, &fill);
            client
                .ep
                .post_rdma_read(&[client.seg(0, 4096)], id, remote, 0)
        }
        .expect(op);
        assert_eq!(
            dto(&next(&client.dto)).1,
            dto_status::SUCCESS,
            "{op} {round}"
        );
        assert_eq!(
            msg.read(0, 4096),
            fill,
            "round {round}: the target's buffer"
        );
        assert_eq!(client.buf.read(0, 4096), fill, "round {round}: ours");
        lmr.free().expect("free");
        assert!(
            daplrs_backend::arena::is_private(addr, len),
            "round {round}: the buffer moved"
        );
    }
    assert_eq!(inline(&c_stats), 600);
    assert_eq!(mapped(&c_stats), 0);
    close(&[&client, &server]);
}

#[test]
fn sends_go_through_the_rings_in_order() {
    use super::Buffer;
    use daplrs_backend::Sge;
    const BIG: usize = 3 * super::super::samehost::ring::CAPACITY + 12_345;
    const SMALL: usize = 100 * 1024;
    let (server, s_stats) = side("srv", mem_priv::ALL, Mode::Require);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    sync_server(&server, &client);
    assert_eq!(
        rings(&s_stats),
        1,
        "the client's frames come through the server's ring"
    );
    // The server's answer to the client's send came after its SWITCH: wait for one more.
    server.buf.write(3000, b"reply");
    client
        .ep
        .post_recv(&[client.seg(3000, 8)], 950, 0)
        .expect("recv");
    server
        .ep
        .post_send(&[server.seg(3000, 5)], 951, 0)
        .expect("send");
    assert_eq!(
        dto(&next(&client.dto)),
        (950, dto_status::SUCCESS, 5, dto_op::RECEIVE)
    );
    assert_eq!(dto(&next(&server.dto)).0, 951);
    assert_eq!(
        rings(&c_stats),
        1,
        "the server's frames come through the client's ring"
    );

    let sbuf = Buffer::new(BIG);
    let cbuf = Buffer::new(BIG);
    let slmr = server.register(&sbuf);
    let clmr = client.register(&cbuf);
    let pattern: Vec<u8> = (0..BIG).map(|i| (i * 13 + i / 4099) as u8).collect();
    cbuf.write(0, &pattern);
    server
        .ep
        .post_recv(
            &[Sge {
                addr: sbuf.addr(),
                length: BIG as u32,
                lkey: slmr.lmr_context(),
            }],
            1,
            0,
        )
        .expect("recv big");
    client
        .ep
        .post_send(
            &[Sge {
                addr: cbuf.addr(),
                length: BIG as u32,
                lkey: clmr.lmr_context(),
            }],
            2,
            0,
        )
        .expect("send big");
    assert_eq!(
        dto(&next(&server.dto)),
        (1, dto_status::SUCCESS, BIG as u32, dto_op::RECEIVE)
    );
    assert_eq!(
        dto(&next(&client.dto)),
        (2, dto_status::SUCCESS, BIG as u32, dto_op::SEND)
    );
    assert!(
        sbuf.read(0, BIG) == pattern,
        "the big message arrived whole"
    );

    // Smaller messages, more in flight than one ring holds (the receives are posted late, so
    // the sends wait at the server meanwhile), each with its own content.
    let count = 48;
    assert!(count * SMALL > 2 * super::super::samehost::ring::CAPACITY);
    for i in 0..count {
        cbuf.write(i * SMALL, &[(i % 251) as u8; SMALL]);
        client
            .ep
            .post_send(
                &[Sge {
                    addr: cbuf.addr() + (i * SMALL) as u64,
                    length: SMALL as u32,
                    lkey: clmr.lmr_context(),
                }],
                10_000 + i as u64,
                0,
            )
            .expect("send small");
    }
    let mut sent = 0;
    for i in 0..count {
        server
            .ep
            .post_recv(
                &[Sge {
                    addr: sbuf.addr() + (i * SMALL) as u64,
                    length: SMALL as u32,
                    lkey: slmr.lmr_context(),
                }],
                20_000 + i as u64,
                0,
            )
            .expect("recv small");
        assert_eq!(
            dto(&next(&server.dto)),
            (
                20_000 + i as u64,
                dto_status::SUCCESS,
                SMALL as u32,
                dto_op::RECEIVE
            )
        );
        assert_eq!(sbuf.read(i * SMALL, SMALL), vec![(i % 251) as u8; SMALL]);
        while let Ok(ev) = client.dto.dequeue() {
            assert_eq!(
                dto(&ev),
                (
                    10_000 + sent,
                    dto_status::SUCCESS,
                    SMALL as u32,
                    dto_op::SEND
                )
            );
            sent += 1;
        }
    }
    while sent < count as u64 {
        assert_eq!(dto(&next(&client.dto)).0, 10_000 + sent);
        sent += 1;
    }
    close(&[&client, &server]);
}

/// Waits (within the hang guard) until `f` holds.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_micros(u64::from(GUARD_US));
    while !f() {
        assert!(Instant::now() < end, "{what}: not within the guard");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// In auto mode (the default) a connection sets the path up at its first request
/// (engine/samehost.rs, `same_host_agreed`): one that carries none holds no ring and maps no
/// table; one that does switches while its messages stream, which arrive in order across
/// the switch, and its RDMA goes inline once the peer's table is there.
#[test]
fn auto_sets_the_path_up_at_a_connections_first_request() {
    let (idle_srv, idle_s) = side("isrv", mem_priv::ALL, Mode::Auto);
    let (idle_cli, idle_c) = side("icli", mem_priv::ALL, Mode::Auto);
    let _idle_psp = connect_pair(&idle_srv, &idle_cli);
    let (server, s_stats) = side("srv", mem_priv::ALL, Mode::Auto);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Auto);
    let _psp = connect_pair(&server, &client);
    assert_eq!(
        attached(&s_stats) + attached(&c_stats),
        0,
        "set up at connect"
    );

    // Rounds of 8 sends posted back to back, from the connection's first request on: the
    // first go over TCP, the later ones through the server's ring.
    for round in 0..4u64 {
        for i in 0..8u64 {
            server
                .ep
                .post_recv(&[server.seg(i as usize * 8, 8)], 100 * round + i, 0)
                .expect("recv");
        }
        for i in 0..8u64 {
            let off = 1024 + i as usize * 8;
            client.buf.write(off, &(round * 8 + i).to_le_bytes());
            client
                .ep
                .post_send(&[client.seg(off, 8)], 1000 * round + i, 0)
                .expect("send");
        }
        for i in 0..8u64 {
            assert_eq!(
                dto(&next(&server.dto)),
                (100 * round + i, dto_status::SUCCESS, 8, dto_op::RECEIVE)
            );
            assert_eq!(
                server.buf.read(i as usize * 8, 8),
                (round * 8 + i).to_le_bytes(),
                "round {round}, message {i}"
            );
        }
        for i in 0..8u64 {
            assert_eq!(dto(&next(&client.dto)).0, 1000 * round + i);
        }
    }
    eventually("the client's frames through the server's ring", || {
        rings(&s_stats) == 1
    });
    eventually("the server's frames through the client's ring", || {
        rings(&c_stats) == 1
    });
    eventually("the client has the server's table", || {
        attached(&c_stats) == 1
    });
    let before = inline(&c_stats);
    client.buf.write(2000, b"inline");
    client
        .ep
        .post_rdma_write(&[client.seg(2000, 6)], 7, server.remote(2100, 6), 0)
        .expect("write");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);
    assert_eq!(server.buf.read(2100, 6), b"inline");
    assert_eq!(inline(&c_stats), before + 1, "the write went inline");

    // The idle pair, connected before all this, set nothing up; its first request does.
    assert_eq!(
        (
            attached(&idle_s),
            attached(&idle_c),
            rings(&idle_s),
            rings(&idle_c)
        ),
        (0, 0, 0, 0),
        "an idle connection holds no ring"
    );
    sync_server(&idle_srv, &idle_cli);
    eventually("the idle pair's path, at its first request", || {
        attached(&idle_s) == 1 && rings(&idle_s) == 1
    });
    close(&[&client, &server, &idle_cli, &idle_srv]);
}

#[test]
fn never_takes_no_inline_op() {
    let (server, s_stats) = side("srv", mem_priv::ALL, Mode::Never);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Never);
    let _psp = connect_pair(&server, &client);
    server.buf.write(0, b"over tcp");
    client
        .ep
        .post_rdma_read(&[client.seg(0, 8)], 1, server.remote(0, 8), 0)
        .expect("read");
    assert_eq!(
        dto(&next(&client.dto)),
        (1, dto_status::SUCCESS, 8, dto_op::RDMA_READ)
    );
    assert_eq!(client.buf.read(0, 8), b"over tcp");
    client
        .ep
        .post_rdma_write(&[client.seg(0, 8)], 2, server.remote(100, 8), 0)
        .expect("write");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);
    assert_eq!(server.buf.read(100, 8), b"over tcp");
    assert_eq!((inline(&c_stats), attached(&c_stats)), (0, 0));
    assert_eq!((inline(&s_stats), attached(&s_stats)), (0, 0));
    close(&[&client, &server]);

    // One side never: auto on the other just stays on TCP.
    let (server, _) = side("srv2", mem_priv::ALL, Mode::Never);
    let (client, c_stats) = side("cli2", mem_priv::ALL, Mode::Auto);
    let _psp = connect_pair(&server, &client);
    client
        .ep
        .post_rdma_read(&[client.seg(0, 8)], 1, server.remote(0, 8), 0)
        .expect("read");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);
    assert_eq!((inline(&c_stats), attached(&c_stats)), (0, 0));
    close(&[&client, &server]);
}

/// A peer that cannot use our offer (another PID namespace: here a server that refuses
/// every offer) declines it: our ring and the receive window published in it go, and the
/// peer's sends land in receives posted before and after, over the socket, in order. (A ring
/// kept waiting for a SWITCH that never comes kept the target signal and the streaming of
/// large sends away from every such connection.)
#[test]
fn a_declined_offer_leaves_the_connection_on_tcp() {
    let (server, s_stats) = test_hooks::refusing_offers(|| side("srv", mem_priv::ALL, Mode::Auto));
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Auto);
    // Receives posted before the connection: published in the client's window at first.
    for (i, off, len) in [(1u64, 0usize, 1024u32), (2, 1024, 1900)] {
        client
            .ep
            .post_recv(&[client.seg(off, len)], i, 0)
            .expect("recv");
    }
    let _psp = connect_pair(&server, &client);
    sync_server(&server, &client);
    assert_eq!(
        attached(&s_stats),
        0,
        "the server refused the client's offer"
    );
    // The client's send went through the server's ring (placed, no ACK to wait for): the
    // decline, on the socket, is read by the client's progress thread when it comes.
    let end = Instant::now() + Duration::from_secs(10);
    while declined(&c_stats) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(declined(&c_stats), 1, "the client heard the server decline");
    assert_eq!(rings(&c_stats), 0);
    // The client's own requests still use the server's table and ring.
    assert_eq!(attached(&c_stats), 1);

    let big = vec![0x5au8; 1900];
    server.buf.write(100, b"first send");
    server.buf.write(1024, &big);
    server
        .ep
        .post_send(&[server.seg(100, 10)], 11, 0)
        .expect("send");
    server
        .ep
        .post_send(&[server.seg(1024, 1900)], 12, 0)
        .expect("send");
    assert_eq!(
        dto(&next(&client.dto)),
        (1, dto_status::SUCCESS, 10, dto_op::RECEIVE)
    );
    assert_eq!(
        dto(&next(&client.dto)),
        (2, dto_status::SUCCESS, 1900, dto_op::RECEIVE)
    );
    assert_eq!(client.buf.read(0, 10), b"first send");
    assert_eq!(client.buf.read(1024, 1900), &big[..]);
    assert_eq!(dto(&next(&server.dto)).0, 11);
    assert_eq!(dto(&next(&server.dto)).0, 12);

    // Writes both ways.
    server.buf.write(200, b"to the client");
    server
        .ep
        .post_rdma_write(&[server.seg(200, 13)], 13, client.remote(3100, 13), 0)
        .expect("write");
    assert_eq!(dto(&next(&server.dto)).1, dto_status::SUCCESS);
    assert_eq!(client.buf.read(3100, 13), b"to the client");
    client.buf.write(3200, b"to the server");
    client
        .ep
        .post_rdma_write(&[client.seg(3200, 13)], 14, server.remote(3300, 13), 0)
        .expect("write");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);
    assert_eq!(server.buf.read(3300, 13), b"to the server");
    close(&[&client, &server]);
}

#[test]
fn require_fails_a_connection_that_cannot_use_it() {
    let (server, _) = side("srv", mem_priv::ALL, Mode::Never);
    let (client, _) = side("cli", mem_priv::ALL, Mode::Require);
    let (_psp, port) = daplrs_core::sp::Sp::create_psp_any(&server.ia, &server.cr, 0).expect("psp");
    client
        .ep
        .connect(Ipv4Addr::LOCALHOST, port, GUARD_US, b"", 0, 0)
        .expect("connect");
    let ev = next(&server.cr);
    let EventData::CrArrival { cr, .. } = ev.data else {
        panic!("not a CR arrival")
    };
    let cr = daplrs_core::handle::cr(cr).expect("live CR");
    cr.accept(Some(&server.ep), b"").expect("accept");
    let ev = next(&client.conn);
    assert_eq!(ev.number, event_number::CONNECTION_NON_PEER_REJECTED);
    assert_eq!(client.ep.state(), EpState::Disconnected);
    close(&[&client, &server]);
}

/// Bad key, out of range, missing privilege: refused here, so sent over TCP, where the target
/// refuses them as it always has (REMOTE_ACCESS, connection broken, memory untouched).
#[test]
fn refusals_give_what_tcp_gives() {
    let (server, _) = side("srv", mem_priv::ALL, Mode::Require);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    assert_eq!(attached(&c_stats), 1);
    super::testing::bad_rkey_write_breaks_the_connection(&server, &client);
    assert_eq!(inline(&c_stats), 0);
    close(&[&client, &server]);

    // Out of range.
    let (server, _) = side("srv2", mem_priv::ALL, Mode::Require);
    let (client, c_stats) = side("cli2", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    super::testing::out_of_range_read_breaks_the_connection(&server, &client);
    assert_eq!(inline(&c_stats), 0);
    close(&[&client, &server]);

    // No remote write privilege (the target's LMR grants remote read only); reads still go.
    let (server, _) = side(
        "srv3",
        mem_priv::LOCAL_READ | mem_priv::LOCAL_WRITE | mem_priv::REMOTE_READ,
        Mode::Require,
    );
    let (client, c_stats) = side("cli3", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    client
        .ep
        .post_rdma_read(&[client.seg(0, 8)], 1, server.remote(0, 8), 0)
        .expect("read");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);
    assert_eq!(inline(&c_stats), 1);
    client.buf.write(0, b"forbidde");
    client
        .ep
        .post_rdma_write(&[client.seg(0, 8)], 2, server.remote(0, 8), 0)
        .expect("post write");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::REMOTE_ACCESS);
    assert_eq!(server.buf.read(0, 8), vec![0u8; 8]);
    assert_eq!(inline(&c_stats), 1);
    close(&[&client, &server]);
}

/// A target whose application polled its EVD and then stopped still serves what needs no
/// call of its own: its progress thread, which deferred the ring to the poller, reads a
/// request that came just after the poller's last look (at its next wake-up) and one that
/// came long after (the writer rings its bell). Here the requests are reads out of range,
/// which the copy path declines and the target answers through the ring.
#[test]
fn a_target_that_stopped_polling_still_serves_its_ring() {
    for pause in [Duration::ZERO, Duration::from_millis(5)] {
        let (server, _) = side("srv", mem_priv::ALL, Mode::Require);
        let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Require);
        let _psp = connect_pair(&server, &client);
        sync_server(&server, &client);
        // The server polls; a message meanwhile wakes its progress thread (asleep on the ring
        // since before), which then sees the poller and defers to it.
        server
            .ep
            .post_recv(&[server.seg(3000, 8)], 2, 0)
            .expect("recv");
        client
            .ep
            .post_send(&[client.seg(3000, 8)], 3, 0)
            .expect("send");
        let until = Instant::now() + Duration::from_millis(3);
        let mut received = false;
        while !received || Instant::now() < until {
            if let Ok(ev) = server.dto.dequeue() {
                assert_eq!(dto(&ev).0, 2);
                received = true;
            }
        }
        assert_eq!(dto(&next(&client.dto)).0, 3);
        std::thread::sleep(pause);
        super::testing::out_of_range_read_breaks_the_connection(&server, &client);
        assert_eq!(rings(&c_stats), 1, "the answer came through the ring");
        close(&[&client, &server]);
    }
}

#[test]
fn a_deregistered_region_is_refused_as_over_tcp() {
    let (server, _) = side("srv", mem_priv::ALL, Mode::Require);
    let (client, c_stats) = side("cli", mem_priv::ALL, Mode::Require);
    let _psp = connect_pair(&server, &client);
    let remote = server.remote(0, 8);
    client
        .ep
        .post_rdma_read(&[client.seg(0, 8)], 1, remote, 0)
        .expect("read");
    assert_eq!(dto(&next(&client.dto)).1, dto_status::SUCCESS);
    assert_eq!(inline(&c_stats), 1);
    server.lmr.free().expect("free the target's LMR");
    client
        .ep
        .post_rdma_read(&[client.seg(0, 8)], 2, remote, 0)
        .expect("read after free");
    assert_eq!(
        dto(&next(&client.dto)),
        (2, dto_status::REMOTE_ACCESS, 0, dto_op::RDMA_READ)
    );
    assert_eq!(next(&client.conn).number, event_number::CONNECTION_BROKEN);
    assert_eq!(inline(&c_stats), 1);
    close(&[&client, &server]);
}

/// A closed device's keeper thread ends (and with it its table): IAs opened and closed
/// over and over leave nothing behind.
#[test]
fn closed_devices_leave_no_keeper_behind() {
    fn keepers() -> usize {
        std::fs::read_dir("/proc/self/task")
            .expect("tasks")
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|c| c.trim() == "daplrs-samehost")
            .count()
    }
    let before = keepers();
    for _ in 0..20 {
        let (s, _) = side("cyc", mem_priv::ALL, Mode::Auto);
        close(&[&s]);
    }
    // Other tests open devices meanwhile: at most their few keepers are alive, not ours.
    let after = keepers();
    assert!(
        after <= before + 8,
        "{before} keepers before, {after} after 20 IAs came and went"
    );
}

mod hostile {
    //! A peer that breaks the same-host handshake breaks only its connection.

    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, TcpStream};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use super::super::super::samehost::{peer::PeerProcess, ring::Ring, test_hooks, Mode};
    use super::super::super::wire::{self, Header, Kind, SameHostOffer};
    use super::super::super::TcpDevice;
    use super::super::GUARD_US;
    use daplrs_backend::{CmEvent, CompletionQueue, Device, QpCap, QpInit, QueuePair};

    fn guard() -> Duration {
        Duration::from_micros(u64::from(GUARD_US))
    }

    struct Target {
        dev: Arc<TcpDevice>,
        cm: mpsc::Receiver<CmEvent>,
        port: u16,
        _listener: Arc<dyn daplrs_backend::Listener>,
        stats: Vec<Arc<super::Stats>>,
    }

    fn target(mode: Mode) -> Target {
        let (dev, stats) =
            test_hooks::open_with(mode, || TcpDevice::open("127.0.0.1").expect("device"));
        let (tx, cm) = mpsc::channel();
        let tx = parking_lot::Mutex::new(tx);
        dev.set_cm_handler(Some(Arc::new(move |ev| {
            let _ = tx.lock().send(ev);
        })));
        let listener = dev.listen(0).expect("listen");
        let port = listener.port();
        Target {
            dev,
            cm,
            port,
            _listener: listener,
            stats,
        }
    }

    /// Connects a raw peer (HELLO with `flags`) and has the target accept it; returns the
    /// socket, after the ACCEPT, the ACCEPT's flags and the target's QP.
    fn connect(t: &Target, flags: u16) -> (TcpStream, u16, Arc<dyn QueuePair>) {
        let (s, flags, qp, _) = connect_with_cq(t, flags);
        (s, flags, qp)
    }

    /// `connect`, and the CQ of the target's QP.
    fn connect_with_cq(
        t: &Target,
        flags: u16,
    ) -> (TcpStream, u16, Arc<dyn QueuePair>, Arc<dyn CompletionQueue>) {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, t.port)).expect("connect");
        s.set_read_timeout(Some(guard())).expect("hang guard");
        let mut h = wire::handshake(Kind::Hello);
        h.flags = flags;
        let mut out = Vec::new();
        wire::put_frame(&mut out, h, b"");
        s.write_all(&out).expect("hello");
        let req = match t.cm.recv_timeout(guard()).expect("request") {
            CmEvent::ConnectRequest { req, .. } => req,
            other => panic!("{other:?}"),
        };
        let pd = t.dev.alloc_pd().expect("pd");
        let cq = t.dev.create_cq(16).expect("cq");
        let qp = t
            .dev
            .create_qp(QpInit {
                pd,
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                srq: None,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_rd_atomic: 1,
                    max_inline: 0,
                },
            })
            .expect("qp");
        t.dev.accept(req, &qp, b"").expect("accept");
        let accept = read_frame(&mut s).expect("ACCEPT");
        assert_eq!(accept.0.kind, Kind::Accept);
        assert!(matches!(
            t.cm.recv_timeout(guard()),
            Ok(CmEvent::Established { .. })
        ));
        (s, accept.0.flags, qp, cq)
    }

    fn read_frame(s: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
        let mut hb = [0u8; wire::HEADER_LEN];
        s.read_exact(&mut hb).ok()?;
        let h = Header::decode(
            &hb,
            &wire::Limits {
                max_message: 1 << 20,
            },
        )
        .ok()?;
        let mut p = vec![0u8; h.payload_len as usize];
        s.read_exact(&mut p).ok()?;
        Some((h, p))
    }

    fn send_offer(s: &mut TcpStream, payload: &[u8]) {
        let mut out = Vec::new();
        wire::put_frame(&mut out, Header::new(Kind::SameHost), payload);
        s.write_all(&out).expect("offer");
    }

    /// The target's first request on `qp`, which in auto mode sends its offer (set up at
    /// first use), ahead of this empty send.
    fn first_request(qp: &Arc<dyn QueuePair>) {
        let wr = daplrs_backend::SendWr {
            wr_id: 1,
            ctx: daplrs_backend::WrContext::NONE,
            op: daplrs_backend::SendOp::Send,
            sgl: Vec::new().into(),
            signaled: true,
            solicited: false,
            fence: false,
        };
        qp.post_send(&wr).expect("the target's first request");
    }

    /// An offer naming our own process with a nonce that is not our table's: well formed,
    /// never checks out.
    fn bogus_offer() -> SameHostOffer {
        SameHostOffer {
            ring_fd: None,
            pid: std::process::id(),
            fd: 0,
            nonce: 1,
            nonce_addr: 8,
            pd: 1,
        }
    }

    fn broken(t: &Target) -> bool {
        matches!(t.cm.recv_timeout(guard()), Ok(CmEvent::Broken { .. }))
    }

    #[test]
    fn an_offer_nobody_asked_for_breaks_the_connection() {
        let t = target(Mode::Auto);
        let (mut s, flags, _qp) = connect(&t, 0);
        assert_eq!(
            flags & wire::FLAG_SAME_HOST,
            0,
            "not advertised: not offered"
        );
        let bogus = bogus_offer();
        send_offer(&mut s, &bogus.encode());
        assert!(broken(&t));
    }

    #[test]
    fn a_bad_offer_keeps_tcp_and_a_second_one_breaks() {
        let t = target(Mode::Auto);
        let (mut s, flags, qp) = connect(&t, wire::FLAG_SAME_HOST);
        assert_ne!(flags & wire::FLAG_SAME_HOST, 0);
        first_request(&qp);
        let (h, p) = read_frame(&mut s).expect("the target's offer");
        assert_eq!(h.kind, Kind::SameHost);
        let theirs = SameHostOffer::decode(&p).expect("well formed");
        assert_eq!(theirs.pid, std::process::id());
        // A forged offer (their own table, a wrong nonce): refused, the connection stays.
        let forged = SameHostOffer {
            ring_fd: None,
            nonce: theirs.nonce ^ 1,
            ..theirs
        };
        send_offer(&mut s, &forged.encode());
        assert!(t.cm.recv_timeout(Duration::from_millis(200)).is_err());
        // A second offer is a protocol error.
        send_offer(&mut s, &forged.encode());
        assert!(broken(&t));

        // Malformed (short) offers break at once, also as the connection's first request.
        let (mut s, _, _qp) = connect(&t, wire::FLAG_SAME_HOST);
        send_offer(&mut s, &[0u8; 8]);
        assert!(broken(&t));
    }

    /// A peer's offer that comes first (its first request, set up at first use) is answered
    /// with the target's, ahead of anything else; one that does not check out is then
    /// declined, and the connection stays on TCP.
    #[test]
    fn an_offer_that_comes_first_is_answered() {
        let t = target(Mode::Auto);
        let (mut s, _, _qp) = connect(&t, wire::FLAG_SAME_HOST);
        let bogus = bogus_offer();
        send_offer(&mut s, &bogus.encode());
        let (h, p) = read_frame(&mut s).expect("the target's answer");
        assert_eq!(h.kind, Kind::SameHost);
        assert_eq!(
            SameHostOffer::decode(&p).expect("well formed").pid,
            std::process::id()
        );
        let (h, _) = read_frame(&mut s).expect("the target's decline");
        assert_eq!(h.kind, Kind::Switch);
        assert_ne!(h.flags & wire::FLAG_DECLINED, 0);
        assert!(t.cm.recv_timeout(Duration::from_millis(200)).is_err());
        // A second offer is a protocol error, as ever.
        send_offer(&mut s, &bogus.encode());
        assert!(broken(&t));
    }

    #[test]
    fn a_switch_without_our_ring_breaks_the_connection() {
        let t = target(Mode::Auto);
        let (mut s, _, _qp) = connect(&t, 0);
        let mut out = Vec::new();
        wire::put_frame(&mut out, Header::new(Kind::Switch), b"");
        s.write_all(&out).expect("switch");
        assert!(broken(&t));
    }

    /// The raw peer's side of the switch: reads the target's offer, maps the ring it names
    /// and sends SWITCH (its next frames would go into that ring).
    fn map_and_switch(s: &mut TcpStream) -> Ring {
        let (_, p) = read_frame(s).expect("the target's offer");
        let theirs = SameHostOffer::decode(&p).expect("well formed");
        let ring_fd = theirs.ring_fd.expect("the target offers a ring");
        let ring =
            Ring::open(&PeerProcess::new(theirs.pid), ring_fd).expect("map the target's ring");
        let mut out = Vec::new();
        wire::put_frame(&mut out, Header::new(Kind::Switch), b"");
        s.write_all(&out).expect("switch");
        ring
    }

    /// A peer that maps the target's ring and then publishes a position past what the ring
    /// holds breaks its connection; the target reads nothing outside the ring.
    #[test]
    fn a_garbled_ring_position_breaks_the_connection() {
        let t = target(Mode::Auto);
        let (mut s, _, qp) = connect(&t, wire::FLAG_SAME_HOST);
        first_request(&qp);
        let ring = map_and_switch(&mut s);
        ring.publish_tail_for_test(u64::MAX / 2);
        s.write_all(&[0]).expect("doorbell");
        assert!(broken(&t));
    }

    /// A polling consumer reads only the ring of a same-host connection (the socket is left to
    /// the progress thread): a peer that switched to the ring and then went away still breaks
    /// the connection while the consumer polls.
    #[test]
    fn a_peer_gone_after_its_switch_breaks_the_connection_while_polled() {
        let t = target(Mode::Auto);
        let (mut s, _, qp, cq) = connect_with_cq(&t, wire::FLAG_SAME_HOST);
        first_request(&qp);
        let _ring = map_and_switch(&mut s);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    cq.progress();
                }
            });
            // The target has read the switch (its frames come through its ring now); then
            // the peer goes away.
            let until = std::time::Instant::now() + guard();
            while t.stats.iter().map(|st| super::rings(st)).sum::<u64>() == 0 {
                assert!(std::time::Instant::now() < until, "the switch was not read");
                std::thread::yield_now();
            }
            drop(s);
            let gone = broken(&t);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(gone, "no BROKEN while the consumer polled");
        });
    }

    #[test]
    fn require_fails_a_connection_whose_offer_does_not_check_out() {
        let t = target(Mode::Require);
        let (mut s, _, _qp) = connect(&t, wire::FLAG_SAME_HOST);
        let (_, p) = read_frame(&mut s).expect("the target's offer");
        let theirs = SameHostOffer::decode(&p).expect("well formed");
        let forged = SameHostOffer {
            ring_fd: None,
            nonce_addr: 8,
            ..theirs
        };
        send_offer(&mut s, &forged.encode());
        assert!(broken(&t));
    }
}
