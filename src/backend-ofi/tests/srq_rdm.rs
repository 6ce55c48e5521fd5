//! A shared receive queue over reliable datagrams (shm, tcp;ofi_rxm: no
//! shared receive contexts there, so a pool of the backend's own, fed through
//! each QP's bounce buffers): two QPs take their receives from one SRQ; every
//! send lands once, in order per QP, in the SRQ's receives in their posting
//! order; messages that find no receive wait for the next ones posted; a
//! receive longer than the bounce buffers posted so far is filled whole; a
//! connection's end leaves the SRQ's receives posted.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use daplrs_backend::{
    access, CompletionQueue, Device, QpInit, QueuePair, RecvWr, SendOp, SharedReceiveQueue,
    WcOpcode, WcStatus, WorkCompletion,
};

use common::{completion, connect_pair, one_device, qp, send_wr, sge};

/// Slots of the receive area, one per receive.
const SLOT: usize = 64;
const MESSAGES: usize = 12;

fn srq_qp(
    dev: &Arc<daplrs_libfabric::OfiDevice>,
    pd: &Arc<dyn daplrs_backend::ProtectionDomain>,
    send_cq: &Arc<dyn CompletionQueue>,
    recv_cq: &Arc<dyn CompletionQueue>,
    srq: &Arc<dyn SharedReceiveQueue>,
) -> Arc<dyn QueuePair> {
    dev.create_qp(QpInit {
        pd: pd.clone(),
        send_cq: send_cq.clone(),
        recv_cq: recv_cq.clone(),
        srq: Some(srq.clone()),
        cap: common::cap(64),
    })
    .unwrap()
}

/// The next `n` completions of `cq` (each within the wait of `completion`).
fn completions(cq: &Arc<dyn CompletionQueue>, n: usize) -> Vec<WorkCompletion> {
    (0..n).map(|_| completion(cq)).collect()
}

fn shared_by_two_qps(provider: &str) {
    let (dev, rx) = one_device(provider);
    let pd = dev.alloc_pd().unwrap();
    let send_cq = dev.create_cq(256).unwrap();
    let recv_cq = dev.create_cq(256).unwrap();
    let srq = dev.create_srq(&pd, 64, 2).unwrap();
    let (a1, a2) = (qp(&dev, &pd, &send_cq), qp(&dev, &pd, &send_cq));
    let (b1, b2) = (
        srq_qp(&dev, &pd, &send_cq, &recv_cq, &srq),
        srq_qp(&dev, &pd, &send_cq, &recv_cq, &srq),
    );
    let rights = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
    let mut out = vec![0u8; 8192];
    let mut area = vec![0u8; 3 * MESSAGES * SLOT + 8192];
    let mr_out = pd
        .reg_mr(out.as_ptr() as u64, out.len() as u64, rights)
        .unwrap();
    let mr_in = pd
        .reg_mr(area.as_ptr() as u64, area.len() as u64, rights)
        .unwrap();
    let post = |srq: &Arc<dyn SharedReceiveQueue>, n: usize, area: &mut [u8]| {
        srq.post_recv(RecvWr {
            wr_id: n as u64,
            ctx: daplrs_backend::WrContext::NONE,
            sgl: vec![sge(area, n * SLOT, SLOT, mr_in.lkey())].into(),
        })
        .unwrap()
    };
    // Half the receives before the connections exist.
    for n in 0..MESSAGES {
        post(&srq, n, &mut area);
    }
    assert_eq!(srq.posted(), MESSAGES as u32);
    connect_pair(&dev, &rx, &a1, &b1);
    connect_pair(&dev, &rx, &a2, &b2);

    // 2 x MESSAGES sends, alternating QPs: the second half find no receive
    // and wait (in bounce buffers, or in the provider beyond those) for the
    // ones posted after them.
    for i in 0..MESSAGES {
        for (q, a) in [(1u8, &a1), (2u8, &a2)] {
            let at = (i * 2 + q as usize - 1) * 16;
            let text = format!("qp{q} message {i:04}");
            out[at..at + text.len()].copy_from_slice(text.as_bytes());
            let s = sge(&mut out, at, text.len(), mr_out.lkey());
            a.post_send(&send_wr((q as u64) << 32 | i as u64, SendOp::Send, vec![s]))
                .unwrap();
        }
    }
    let mut got = completions(&recv_cq, MESSAGES);
    assert_eq!(srq.posted(), 0);
    for n in MESSAGES..2 * MESSAGES {
        post(&srq, n, &mut area);
    }
    got.extend(completions(&recv_cq, MESSAGES));
    // A send whose message found no receive may complete only once it is
    // taken (shm reports delivery then): after the receives, not before.
    for wc in completions(&send_cq, 2 * MESSAGES) {
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Send));
    }

    // Each receive once, in posting order; each message once, in order per QP.
    let mut next = HashMap::from([(b1.qp_num(), 0usize), (b2.qp_num(), 0usize)]);
    let names = HashMap::from([(b1.qp_num(), 1u8), (b2.qp_num(), 2u8)]);
    for (n, wc) in got.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (n as u64, WcStatus::Success, WcOpcode::Recv, 16),
            "receive {n}"
        );
        let i = next.get_mut(&wc.qp_num).expect("an SRQ QP");
        let want = format!("qp{} message {:04}", names[&wc.qp_num], *i);
        assert_eq!(
            &area[n * SLOT..n * SLOT + 16],
            want.as_bytes(),
            "receive {n}"
        );
        *i += 1;
    }
    assert_eq!(next[&b1.qp_num()], MESSAGES);
    assert_eq!(next[&b2.qp_num()], MESSAGES);

    // A receive longer than every bounce buffer posted: the next message
    // fills it whole (the QPs post longer buffers first).
    let long = 3 * MESSAGES * SLOT;
    srq.post_recv(RecvWr {
        wr_id: 999,
        ctx: daplrs_backend::WrContext::NONE,
        sgl: vec![sge(&mut area, long, 4096, mr_in.lkey())].into(),
    })
    .unwrap();
    for (i, b) in out[..4000].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let s = sge(&mut out, 0, 4000, mr_out.lkey());
    a2.post_send(&send_wr(7, SendOp::Send, vec![s])).unwrap();
    assert_eq!(completion(&send_cq).status, WcStatus::Success);
    let wc = completion(&recv_cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.qp_num),
        (999, WcStatus::Success, 4000, b2.qp_num())
    );
    assert_eq!(&area[long..long + 4000], &out[..4000]);

    // A connection's end flushes nothing of the SRQ's: its receives stay.
    post(&srq, 2 * MESSAGES + 1, &mut area);
    dev.disconnect(&a1, false).unwrap();
    for _ in 0..2 {
        common::event(&rx);
    }
    let mut none = Vec::new();
    assert_eq!(recv_cq.poll(4, &mut none), 0, "{none:?}");
    assert_eq!(srq.posted(), 1);
    // The other QP goes on receiving from it.
    let s = sge(&mut out, 0, 16, mr_out.lkey());
    a2.post_send(&send_wr(8, SendOp::Send, vec![s])).unwrap();
    assert_eq!(completion(&send_cq).status, WcStatus::Success);
    let wc = completion(&recv_cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.qp_num),
        ((2 * MESSAGES + 1) as u64, WcStatus::Success, b2.qp_num())
    );
    for q in [&a1, &a2, &b1, &b2] {
        q.destroy();
    }
    drop((a1, a2, b1, b2));
    srq.destroy();
    mr_out.deregister();
    mr_in.deregister();
    dev.close();
}

#[test]
fn srq_shared_by_two_qps_shm() {
    shared_by_two_qps("shm");
}

#[test]
fn srq_shared_by_two_qps_tcp_rxm() {
    shared_by_two_qps("tcp;ofi_rxm");
}
