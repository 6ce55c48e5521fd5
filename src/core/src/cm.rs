//! Connection-manager events, from an IA's device to what they concern: a connection or
//! datagram request to the service point of its listener, the progress of a connection or of
//! an address resolution to the EP of its QP, the device's own troubles to the async EVD.
//! `Ia::open` hands the device `on_cm_event` as its handler.

use std::sync::Arc;

use super::consts::event_number;
use super::ep::Ep;
use super::handle::{self, Object};
use super::handle_table::Handle;
use super::ia::Ia;
use super::sp::Sp;
use daplrs_backend::CmEvent;

/// Routes one event of the IA's device.
pub(crate) fn on_cm_event(ia: &Ia, ev: CmEvent) {
    log::debug!("IA {}: cm event {:?}", ia.name(), ev);
    match ev {
        // A datagram EP's address-resolution request takes the connection request's path.
        CmEvent::ConnectRequest { .. } | CmEvent::UdRequest { .. } => on_request(ia, ev),
        CmEvent::RequestCancelled { .. } => {}
        // The IA is unusable (its EPs' connections are reported broken one by one).
        CmEvent::DeviceLost => ia.post_async(
            event_number::ASYNC_IA_CATASTROPHIC,
            ia.handle(),
            Handle::NULL,
        ),
        CmEvent::CqOverrun { cq } => {
            let overran = handle::children(ia.handle())
                .into_iter()
                .find_map(|(h, o)| {
                    matches!(&o, Object::Evd(e) if e.cq().is_some_and(|c| c.id() == cq))
                        .then_some(h)
                });
            if let Some(evd) = overran {
                ia.post_async(event_number::ASYNC_EVD_OVERFLOW, evd, evd);
            }
        }
        ev => on_ep_event(ia, ev),
    }
}

/// A request reached a listener: its service point takes it; one that is being created takes
/// it on registering (`Ia::register_listener`); a listener whose service point is gone
/// rejects it.
fn on_request(ia: &Ia, ev: CmEvent) {
    let (CmEvent::ConnectRequest { listener, .. } | CmEvent::UdRequest { listener, .. }) = ev
    else {
        return;
    };
    let sp = {
        let sps = ia.sps_by_listener.lock();
        match sps.get(&listener) {
            Some(w) => w.upgrade().and_then(|sp| sp.downcast::<Sp>().ok()),
            None if !ia.closed_listeners.lock().contains(&listener) => {
                ia.early_requests
                    .lock()
                    .entry(listener)
                    .or_default()
                    .push(ev);
                return;
            }
            None => None,
        }
    };
    match (sp, ev) {
        (Some(sp), ev) => sp.on_request(ev),
        (None, CmEvent::ConnectRequest { req, .. } | CmEvent::UdRequest { req, .. }) => {
            let _ = ia.device().reject(req, &[]);
        }
        (None, _) => {}
    }
}

/// An event of one EP's connection or address resolution, named by its QP's number.
fn on_ep_event(ia: &Ia, ev: CmEvent) {
    match ev {
        CmEvent::UdResolved {
            qp_num,
            peer,
            private_data,
            ..
        } => {
            if let Some(ep) = ep_by_qp(ia, qp_num) {
                ep.on_ud_resolved(peer, private_data, false);
            }
        }
        CmEvent::UdFailed {
            qp_num,
            by_peer,
            private_data,
            ..
        } => {
            if let Some(ep) = ep_by_qp(ia, qp_num) {
                ep.on_ud_failed(by_peer, private_data);
            }
        }
        CmEvent::Established {
            qp_num,
            private_data,
        } => {
            if let Some(ep) = ep_by_qp(ia, qp_num) {
                ep.on_established(private_data);
            }
        }
        CmEvent::Rejected {
            qp_num,
            private_data,
            by_peer,
        } => {
            if let Some(ep) = ep_by_qp(ia, qp_num) {
                let number = if by_peer {
                    event_number::CONNECTION_PEER_REJECTED
                } else {
                    event_number::CONNECTION_NON_PEER_REJECTED
                };
                ep.on_connection_lost(number, private_data);
            }
        }
        CmEvent::Unreachable { qp_num } => {
            if let Some(ep) = ep_by_qp(ia, qp_num) {
                ep.on_connection_lost(event_number::CONNECTION_UNREACHABLE, Vec::new());
            }
        }
        CmEvent::TimedOut { qp_num } => {
            if let Some(ep) = ep_by_qp(ia, qp_num) {
                ep.on_connection_lost(event_number::CONNECTION_TIMED_OUT, Vec::new());
            }
        }
        CmEvent::Disconnected { qp_num } => {
            if let Some(ep) = ep_by_qp(ia, qp_num) {
                on_connection_ended(&ep, event_number::CONNECTION_DISCONNECTED);
            }
        }
        CmEvent::Broken { qp_num } => {
            if let Some(ep) = ep_by_qp(ia, qp_num) {
                on_connection_ended(&ep, event_number::CONNECTION_BROKEN);
            }
        }
        _ => {}
    }
}

/// The connection ended (`number`: DISCONNECTED or BROKEN); a datagram EP's QP stopped.
fn on_connection_ended(ep: &Ep, number: u32) {
    if ep.is_ud() {
        ep.on_ud_stopped(number);
    } else {
        ep.on_connection_lost(number, Vec::new());
    }
}

fn ep_by_qp(ia: &Ia, qp_num: u32) -> Option<Arc<Ep>> {
    let ep = ia.eps_by_qp.lock().get(&qp_num)?.ep.upgrade()?;
    ep.downcast().ok()
}
