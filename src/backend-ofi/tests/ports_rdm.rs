//! Many connections over reliable datagrams share endpoints ("ports", one
//! per EVD set and side, docs/libfabric.md "Many connections over reliable
//! datagrams"), and share the provider's receive depth: each QP always may
//! give it one receive, more take the port's spare slots as they free.
//!
//! This binary (its own process: libfabric reads the variables when it loads
//! its providers) shrinks shm's and ofi_rxm's queues to 16, so that 40
//! connections on one EVD set need three ports a side, and a QP that posts
//! 25 receives has most of them wait for room: every message still lands in
//! its connection's receives, in order, and every send completes.

mod common;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use daplrs_backend::{
    access, CmEvent, CompletionQueue, Device, QueuePair, RecvWr, SendOp, WcOpcode, WcStatus,
    WorkCompletion,
};

use common::{event, qp_of_depth, send_wr, sge};

const PAIRS: usize = 40;
const DEEP: usize = 25;
const SLOT: usize = 64;

/// The next `n` completions of `cq` (10 s at most).
fn completions(cq: &std::sync::Arc<dyn CompletionQueue>, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} completions in 10 s",
            out.len()
        );
        if cq.poll(n - out.len(), &mut out) == 0 {
            std::thread::yield_now();
        }
    }
    out
}

fn many_connections_on_one_evd_set(provider: &str) {
    let (devs, rx) = common::two_devices(provider);
    // The variables took: the provider's transmit depth is what bounds reads in flight.
    assert_eq!(
        devs[0].attr().max_rd_atomic,
        16,
        "{provider}'s queues of 16"
    );
    let cqs = [
        devs[0].create_cq(1024).unwrap(),
        devs[1].create_cq(1024).unwrap(),
    ];
    let pds = [devs[0].alloc_pd().unwrap(), devs[1].alloc_pd().unwrap()];
    let rights = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
    // Each side: a slot per QP to send from, DEEP + 1 slots per QP to receive into.
    let mut send_bufs = [vec![0u8; PAIRS * SLOT], vec![0u8; PAIRS * SLOT]];
    let mut recv_bufs = [
        vec![0u8; PAIRS * (DEEP + 1) * SLOT],
        vec![0u8; PAIRS * (DEEP + 1) * SLOT],
    ];
    let mrs: Vec<_> = (0..2)
        .map(|s| {
            let send = pds[s]
                .reg_mr(
                    send_bufs[s].as_ptr() as u64,
                    send_bufs[s].len() as u64,
                    rights,
                )
                .unwrap();
            let recv = pds[s]
                .reg_mr(
                    recv_bufs[s].as_ptr() as u64,
                    recv_bufs[s].len() as u64,
                    rights,
                )
                .unwrap();
            (send, recv)
        })
        .collect();
    let qps: Vec<Vec<std::sync::Arc<dyn QueuePair>>> = (0..2)
        .map(|s| {
            (0..PAIRS)
                .map(|_| qp_of_depth(&devs[s], &pds[s], &cqs[s], 32))
                .collect()
        })
        .collect();
    // Where receive k of pair i lands (each side's buffer alike).
    let recv_at = |_side: usize, i: usize, k: usize| (i * (DEEP + 1) + k) * SLOT;
    // Every QP has one receive before its connection is made.
    for (s, side) in qps.iter().enumerate() {
        for (i, q) in side.iter().enumerate() {
            let at = recv_at(s, i, 0);
            let lkey = mrs[s].1.lkey();
            q.post_recv(RecvWr {
                wr_id: (i * 100) as u64,
                ctx: daplrs_backend::WrContext::NONE,
                sgl: vec![sge(&mut recv_bufs[s], at, SLOT, lkey)].into(),
            })
            .unwrap();
        }
    }
    let listener = devs[1].listen(0).unwrap();
    let at = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.port());
    for (i, a) in qps[0].iter().enumerate() {
        devs[0]
            .connect(a, at, &(i as u32).to_le_bytes(), None)
            .unwrap();
    }
    // Accepted as they come, the passive QP of pair i for the request of active QP i.
    let mut established = 0;
    let mut pair_of: HashMap<u32, usize> = HashMap::new();
    while established < 2 * PAIRS {
        match event(&rx) {
            CmEvent::ConnectRequest {
                req, private_data, ..
            } => {
                let i = u32::from_le_bytes(private_data[..4].try_into().unwrap()) as usize;
                devs[1].accept(req, &qps[1][i], b"").unwrap();
                pair_of.insert(qps[1][i].qp_num(), i);
            }
            CmEvent::Established { .. } => established += 1,
            e => panic!("{provider}: {e:?}"),
        }
    }

    // Pair 0's passive QP posts DEEP more receives: most wait for room.
    for k in 1..=DEEP {
        let at = recv_at(1, 0, k);
        let lkey = mrs[1].1.lkey();
        qps[1][0]
            .post_recv(RecvWr {
                wr_id: k as u64,
                ctx: daplrs_backend::WrContext::NONE,
                sgl: vec![sge(&mut recv_bufs[1], at, SLOT, lkey)].into(),
            })
            .unwrap();
    }
    // DEEP + 1 messages from pair 0's active QP, each naming its number.
    let lkey = mrs[0].0.lkey();
    for k in 0..=DEEP {
        send_bufs[0][..8].copy_from_slice(&(k as u64).to_le_bytes());
        qps[0][0]
            .post_send(&send_wr(
                k as u64,
                SendOp::Send,
                vec![sge(&mut send_bufs[0], 0, 8, lkey)],
            ))
            .unwrap();
        // One at a time: the buffer is reused.
        let wc = completions(&cqs[0], 1).pop().unwrap();
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (k as u64, WcStatus::Success, WcOpcode::Send),
            "{provider}"
        );
    }
    let got = completions(&cqs[1], DEEP + 1);
    for (k, wc) in got.iter().enumerate() {
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len),
            (WcStatus::Success, WcOpcode::Recv, 8),
            "{provider}: receive {k}"
        );
        assert_eq!(
            wc.wr_id,
            if k == 0 { 0 } else { k as u64 },
            "{provider}: order"
        );
        let at = recv_at(1, 0, k);
        let n = u64::from_le_bytes(recv_bufs[1][at..at + 8].try_into().unwrap());
        assert_eq!(n, k as u64, "{provider}: message {k} in receive {k}");
    }

    // Every other pair: a message each way, on every port.
    for (i, q) in qps[0].iter().enumerate().skip(1) {
        let at = i * SLOT;
        send_bufs[0][at..at + 8].copy_from_slice(&(i as u64).to_le_bytes());
        let lkey = mrs[0].0.lkey();
        q.post_send(&send_wr(
            i as u64,
            SendOp::Send,
            vec![sge(&mut send_bufs[0], at, 8, lkey)],
        ))
        .unwrap();
    }
    let sent = completions(&cqs[0], PAIRS - 1);
    assert!(sent.iter().all(|wc| wc.status == WcStatus::Success));
    let got = completions(&cqs[1], PAIRS - 1);
    for wc in &got {
        assert_eq!(wc.status, WcStatus::Success, "{provider}");
        let i = pair_of[&wc.qp_num];
        assert_eq!(wc.wr_id, (i * 100) as u64, "{provider}: pair {i}'s receive");
        let at = recv_at(1, i, 0);
        let n = u64::from_le_bytes(recv_bufs[1][at..at + 8].try_into().unwrap());
        assert_eq!(n, i as u64, "{provider}: pair {i}'s message");
    }
    for (i, q) in qps[1].iter().enumerate().skip(1) {
        let at = i * SLOT;
        send_bufs[1][at..at + 8].copy_from_slice(&(1000 + i as u64).to_le_bytes());
        let lkey = mrs[1].0.lkey();
        q.post_send(&send_wr(
            i as u64,
            SendOp::Send,
            vec![sge(&mut send_bufs[1], at, 8, lkey)],
        ))
        .unwrap();
    }
    assert!(completions(&cqs[1], PAIRS - 1)
        .iter()
        .all(|wc| wc.status == WcStatus::Success));
    let got = completions(&cqs[0], PAIRS - 1);
    for wc in &got {
        assert_eq!(wc.status, WcStatus::Success, "{provider}");
        let i = (wc.wr_id / 100) as usize;
        let at = recv_at(0, i, 0);
        let n = u64::from_le_bytes(recv_bufs[0][at..at + 8].try_into().unwrap());
        assert_eq!(n, 1000 + i as u64, "{provider}: pair {i}'s answer");
    }

    for s in 0..2 {
        for q in &qps[s] {
            q.destroy();
        }
        mrs[s].0.deregister();
        mrs[s].1.deregister();
        devs[s].close();
    }
}

#[test]
fn forty_connections_share_ports_whose_receive_depth_is_sixteen() {
    std::env::set_var("FI_SHM_RX_SIZE", "16");
    std::env::set_var("FI_SHM_TX_SIZE", "16");
    std::env::set_var("FI_OFI_RXM_RX_SIZE", "16");
    std::env::set_var("FI_OFI_RXM_TX_SIZE", "16");
    many_connections_on_one_evd_set("shm");
    many_connections_on_one_evd_set("tcp;ofi_rxm");
}
