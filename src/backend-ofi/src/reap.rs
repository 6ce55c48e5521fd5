//! Reading a CQ: each provider entry handed to the QP its context names (a
//! port's eager buffer's to the port, then to its connection's QP), in each
//! QP's posting order; then the receipt words of the QPs awaiting one, and
//! the receipts due written. Above the QPs: a CQ reaches this through the
//! `Reader` it was given at its creation (the device's registry), so that
//! nothing below calls up.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use daplrs_backend::WorkCompletion;

use crate::cq::{drain, Done, OfiCq, Reader};
use crate::domain::Domain;
use crate::qp::{OfiQp, Registry};

impl Reader for Registry {
    fn read(&self, cq: &OfiCq, consumer: bool) -> bool {
        let Some(dev) = cq.dev.upgrade() else {
            return false;
        };
        let (mut added, broken) = reap_giving_receipts(cq, &dev, self);
        for qp in cq.datagram_qps() {
            if let Ok(qp) = qp.downcast::<crate::dgram::DgramQp>() {
                added |= qp.progress(consumer.then_some(cq));
            }
        }
        if consumer {
            // The core polls with its EVD's lock held, and a broken
            // connection's flush would notify that EVD (and take that lock)
            // from inside it: the progress thread breaks it instead, at once.
            if !broken.is_empty() {
                self.defer_broken(broken);
            }
        } else {
            for qp in broken {
                qp.broken();
            }
        }
        added
    }
}

/// A QP as a CQ keeps it for its reader (an SRQ QP's own feed, a QP
/// awaiting receipts): ours.
fn qp_of(kept: Arc<dyn Any + Send + Sync>) -> Option<Arc<OfiQp>> {
    kept.downcast::<OfiQp>().ok()
}

/// `reap_locked`, then the receipts it found due, written once no lock is
/// held; returns whether completions were added and the QPs whose
/// connection broke, for the caller to break as its context allows.
fn reap_giving_receipts(cq: &OfiCq, dev: &Domain, registry: &Registry) -> (bool, Vec<Arc<OfiQp>>) {
    let mut broken = Vec::new();
    let mut receipts = Vec::new();
    let added = reap_locked(cq, dev, registry, &mut broken, &mut receipts);
    for qp in receipts {
        qp.send_receipt();
    }
    (added, broken)
}

/// Reads the fid_cq (or the feeds ready) into the queue; QPs whose connection
/// broke go to `broken`, those with a receipt to give to `receipts` (both
/// handled by the caller once no lock is held: a receipt is a socket write).
fn reap_locked(
    cq: &OfiCq,
    dev: &Domain,
    registry: &Registry,
    broken: &mut Vec<Arc<OfiQp>>,
    receipts: &mut Vec<Arc<OfiQp>>,
) -> bool {
    let mut q = cq.queue.lock();
    let before = q.len();
    // No endpoint of the device closes while its CQ is read (see `Domain::closing`).
    let _reading = dev.closing.lock();
    let verbs = dev.verbs_errors;
    if cq.shared {
        drain(cq.cq.ptr(), verbs, true, |done| {
            complete(registry, done, &mut q, broken, receipts)
        });
    }
    for source in cq.ready.take() {
        let srq = source.srq.clone().and_then(qp_of);
        drain(source.feed.cq.ptr(), verbs, false, |done| match &srq {
            None => complete(registry, done, &mut q, broken, receipts),
            Some(qp) => {
                if qp.srq_received(done.context as u32, done.result, done.data, &mut q) {
                    broken.push(qp.clone());
                }
            }
        });
    }
    drop(_reading);
    take_receipts(cq, &mut q, broken);
    q.len() > before
}

/// Reads the receipt words of the QPs awaiting one (what the drain just
/// read of the provider may have placed there); forgets those that await
/// none now.
fn take_receipts(cq: &OfiCq, q: &mut VecDeque<WorkCompletion>, broken: &mut Vec<Arc<OfiQp>>) {
    let awaiting: Vec<Arc<OfiQp>> = {
        let a = cq.awaiting.lock();
        if a.is_empty() {
            return;
        }
        a.iter()
            .filter_map(Weak::upgrade)
            .filter_map(qp_of)
            .collect()
    };
    for qp in &awaiting {
        if qp.take_receipt(q) {
            broken.push(qp.clone());
        }
    }
    let mut seen = std::collections::HashSet::new();
    cq.awaiting.lock().retain(|w| {
        w.upgrade()
            .and_then(qp_of)
            .is_some_and(|qp| qp.awaits_receipts())
            && seen.insert(w.as_ptr() as *const () as usize)
    });
}

/// Hands one entry to the QP its context names (a port's eager buffer's
/// entry to the port: `port::POOL_CONN`).
fn complete(
    registry: &Registry,
    done: Done,
    q: &mut VecDeque<WorkCompletion>,
    broken: &mut Vec<Arc<OfiQp>>,
    receipts: &mut Vec<Arc<OfiQp>>,
) {
    let conn = (done.context >> 32) as u32;
    if conn == crate::port::POOL_CONN {
        let Some((port, qp, arrival)) = registry.pool_landed(&done) else {
            return;
        };
        let broke = qp.arrived(&port, arrival, q);
        if qp.receipt_due() && !receipts.iter().any(|r| Arc::ptr_eq(r, &qp)) {
            receipts.push(qp.clone());
        }
        if broke {
            broken.push(qp);
        }
        return;
    }
    match registry.conn(conn) {
        Some(qp) => {
            let broke = qp.completed(done.context as u32, done.result, done.data, q);
            if qp.receipt_due() && !receipts.iter().any(|r| Arc::ptr_eq(r, &qp)) {
                receipts.push(qp.clone());
            }
            if broke {
                broken.push(qp);
            }
        }
        // A connection that ended (its QP reset or gone): nothing to report.
        None => log::debug!("completion for connection {conn}, gone"),
    }
}
