//! Device faults: a device that fails or is removed under open IAs, a completion queue that
//! overruns, a port that goes down and comes back.
//!
//! A device announces its end two ways: a fatal asynchronous event on the context's
//! descriptor (a NIC's firmware failing; the kernel's removal of a device whose driver can
//! let go of user contexts), and rdma_cm's DEVICE_REMOVAL on each id bound to it (the removal
//! of one that cannot, soft-RoCE and soft-iWARP among them: `rdma link delete` then waits
//! until every process has closed the device). Either way each IA on the device breaks every
//! QP it has, connected or not: what was posted completes flushed here, once (qp.rs
//! `flush_lost`: a dead device completes nothing more), and tells the core
//! once (`CmEvent::DeviceLost`: DAT_ASYNC_ERROR_IA_CATASTROPHIC). IAs on one device share the
//! context's descriptor, and whichever event thread reads an event serves every IA of it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use rdma_sys::*;

use super::qp::all_qps;
use super::shared::Shared;
use daplrs_backend::CmEvent;

/// Every open device (IA) of the process, with its context.
type Devices = Mutex<Vec<(usize, Weak<Shared>)>>;
fn all_devices() -> &'static Devices {
    static DEVICES: OnceLock<Devices> = OnceLock::new();
    DEVICES.get_or_init(|| Mutex::new(Vec::new()))
}

pub(super) fn register(s: &Arc<Shared>) {
    let mut all = all_devices().lock();
    all.retain(|(_, w)| w.strong_count() > 0);
    all.push((s.ctx.0 as usize, Arc::downgrade(s)));
}

/// The open IAs on the device of context `ctx`.
fn on_context(ctx: usize) -> Vec<Arc<Shared>> {
    all_devices()
        .lock()
        .iter()
        .filter(|(c, _)| *c == ctx)
        .filter_map(|(_, w)| w.upgrade())
        .collect()
}

impl Shared {
    /// The device is gone (`why`): every QP of this IA breaks, once, and the core hears of it.
    pub(super) fn device_lost(&self, why: &str) {
        if self.lost.swap(true, Ordering::SeqCst) {
            return;
        }
        log::error!(
            "verbs {}: {why}: the device is gone; every connection of the IA breaks",
            self.name
        );
        let ctx = self.ctx.0 as usize;
        let mine: Vec<_> = all_qps()
            .lock()
            .iter()
            .filter(|((c, _), _)| *c == ctx)
            .filter_map(|(_, w)| w.upgrade().filter(|q| std::ptr::eq(&*q.shared, self)))
            .collect();
        // What was posted completes flushed here: a device that died completes nothing more
        // (one being removed might; what it reports then is dropped). Datagram QPs keep the
        // device's flushes.
        for qp in mine {
            if !qp.ud {
                qp.flush_lost();
            }
            self.defer_break(qp.qp_num);
        }
        self.defer_event(CmEvent::DeviceLost);
    }
}

/// rdma_cm said `s`'s device is being removed (on one of its ids): every IA on it is told.
pub(super) fn device_removed(s: &Arc<Shared>) {
    lost_on_context(s.ctx.0 as usize, "rdma_cm: device removed");
}

/// Every IA on the device of context `ctx` loses it (`why`).
fn lost_on_context(ctx: usize, why: &str) {
    for ia in on_context(ctx) {
        ia.device_lost(why);
    }
}

/// A device-wide asynchronous event read by `s`'s event thread: served for every IA of the
/// device. Returns false for events of another kind (QP events: events.rs `async_events`).
pub(super) fn device_event(s: &Arc<Shared>, ev: &ibv_async_event) -> bool {
    use ibv_event_type::*;
    let ctx = s.ctx.0 as usize;
    match ev.event_type {
        IBV_EVENT_DEVICE_FATAL => lost_on_context(ctx, "fatal device error"),
        IBV_EVENT_CQ_ERR => {
            // SAFETY: a CQ event carries the CQ, whose context is our id for it (cq.rs).
            let id = unsafe { (*ev.element.cq).cq_context } as usize as u64;
            log::error!("verbs {}: completion queue {id} overran", s.name);
            for ia in on_context(ctx) {
                if ia.cqs.lock().contains_key(&id) {
                    ia.defer_event(CmEvent::CqOverrun { cq: id });
                }
            }
        }
        IBV_EVENT_PORT_ERR | IBV_EVENT_PORT_ACTIVE => {
            // SAFETY: a port event carries the port number.
            let port = unsafe { ev.element.port_num };
            let up = ev.event_type == IBV_EVENT_PORT_ACTIVE;
            for ia in on_context(ctx)
                .into_iter()
                .filter(|ia| i32::from(ia.port) == port)
            {
                match up {
                    true => log::error!("verbs {}: the port is up again", ia.name),
                    false => log::error!(
                        "verbs {}: the port went down: connections through it fail until it is up",
                        ia.name
                    ),
                }
            }
        }
        _ => return false,
    }
    true
}
