//! Many connections at once over tcp;ofi_rxm (FI_EP_RDM, our connection
//! layer), as Debian's dtestcm makes them: every endpoint connects before
//! any request is accepted, the passive side accepts them as they come, and
//! every connection is established, then carries a send and disconnects.
//!
//! ofi_rxm (1.17) over tcp filled a shared receive context of 1,024 buffers
//! of FI_OFI_RXM_BUFFER_SIZE (16 KiB) when an endpoint was enabled: about 33
//! MB and 100-200 ms per endpoint, which made dtestcm's 1,000 endpoints a
//! process seem to hang. The backend turns that context off
//! (FI_OFI_RXM_USE_SRX=0, src/backend-ofi/src/lib.rs): this runs with
//! libfabric's defaults otherwise (docs/libfabric.md, "Many endpoints over
//! ofi_rxm").

mod common;

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};

use daplrs_backend::{access, CmEvent, Device, RecvWr, SendOp, WcStatus};

use common::{completion, event, qp, send_wr, sge};

const CONNECTIONS: usize = 200;

#[test]
fn two_hundred_connects_at_once_over_tcp_rxm() {
    let (devs, rx) = common::two_devices("tcp;ofi_rxm");
    let cqs = [
        devs[0].create_cq(4 * CONNECTIONS as u32).unwrap(),
        devs[1].create_cq(4 * CONNECTIONS as u32).unwrap(),
    ];
    let pds = [devs[0].alloc_pd().unwrap(), devs[1].alloc_pd().unwrap()];
    let active: Vec<_> = (0..CONNECTIONS)
        .map(|_| qp(&devs[0], &pds[0], &cqs[0]))
        .collect();
    let passive: Vec<_> = (0..CONNECTIONS)
        .map(|_| qp(&devs[1], &pds[1], &cqs[1]))
        .collect();
    let listener = devs[1].listen(0).unwrap();
    let at = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.port());
    for (i, a) in active.iter().enumerate() {
        let private_data = (i as u32).to_le_bytes();
        devs[0].connect(a, at, &private_data, None).unwrap();
    }
    // Requests accepted as they come; both sides' establishments counted.
    let mut accepted = 0;
    // QP numbers are per device: one may be established on each side.
    let mut established: HashMap<u32, usize> = HashMap::new();
    let mut seen = HashSet::new();
    while established.values().sum::<usize>() < 2 * CONNECTIONS {
        match event(&rx) {
            CmEvent::ConnectRequest {
                req, private_data, ..
            } => {
                assert!(seen.insert(private_data[..4].to_vec()), "request twice");
                devs[1].accept(req, &passive[accepted], b"").unwrap();
                accepted += 1;
            }
            CmEvent::Established { qp_num, .. } => {
                let n = established.entry(qp_num).or_default();
                *n += 1;
                assert!(*n <= 2, "QP {qp_num} established three times");
            }
            e => panic!("after {accepted} accepted: {e:?}"),
        }
    }
    assert_eq!(accepted, CONNECTIONS);
    // Each connection carries a message.
    let mut buf = vec![0u8; 64 * CONNECTIONS];
    let mut theirs = vec![0u8; 64 * CONNECTIONS];
    let rights = access::LOCAL_WRITE;
    let mr_a = pds[0]
        .reg_mr(buf.as_ptr() as u64, buf.len() as u64, rights)
        .unwrap();
    let mr_b = pds[1]
        .reg_mr(theirs.as_ptr() as u64, theirs.len() as u64, rights)
        .unwrap();
    for (i, b) in passive.iter().enumerate() {
        b.post_recv(RecvWr {
            wr_id: i as u64,
            ctx: daplrs_backend::WrContext::NONE,
            sgl: vec![sge(&mut theirs, 64 * i, 64, mr_b.lkey())].into(),
        })
        .unwrap();
    }
    for (i, a) in active.iter().enumerate() {
        a.post_send(&send_wr(
            i as u64,
            SendOp::Send,
            vec![sge(&mut buf, 64 * i, 8, mr_a.lkey())],
        ))
        .unwrap();
    }
    for cq in &cqs {
        for _ in 0..CONNECTIONS {
            assert_eq!(completion(cq).status, WcStatus::Success);
        }
    }
    for a in &active {
        devs[0].disconnect(a, false).unwrap();
    }
    for _ in 0..2 * CONNECTIONS {
        assert!(matches!(event(&rx), CmEvent::Disconnected { .. }));
    }
    for q in active.iter().chain(&passive) {
        q.destroy();
    }
    mr_a.deregister();
    mr_b.deregister();
    drop(listener);
    for d in &devs {
        d.close();
    }
}
