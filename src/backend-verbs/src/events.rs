//! The IA's event thread (`event_loop`): it waits (poll(2), never spinning) on three
//! descriptors: the IA's completion channel (it acknowledges and re-arms the CQ, then lets
//! the CQ's consumer reap it: cq.rs `completion_events`), the IA's rdma_cm event channel
//! (connection events, acknowledged before they are handled so that handlers may destroy
//! ids: cm.rs), and the device's asynchronous event descriptor (QP fatal errors become
//! broken connections; device faults: fault.rs). It also does the work other threads leave
//! it (`Deferred`): connection events handed to the core, connections broken.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rdma_sys::*;

use super::qp::all_qps;
use super::shared::{Deferred, Shared};
use super::{cm, cq, fault, sys};

/// How often the event thread looks at the completion channel again while consumers sleep
/// on it themselves.
const DRIVER_RECHECK_MS: i32 = 10;

/// The event thread: completion notifications, connection events, async events, deferred work.
pub(super) fn event_loop(s: Arc<Shared>) {
    // SAFETY: descriptors of objects `s` owns, valid until the loop ends.
    let (comp_fd, cm_fd, async_fd) = unsafe {
        (
            (*s.comp_channel.0).fd,
            (*s.cm_channel.0).fd,
            (*s.ctx.0).async_fd,
        )
    };
    let wake_fd = s.wake.as_raw_fd();
    loop {
        if s.closing.load(Ordering::SeqCst) {
            break;
        }
        let mut fds = [
            sys::pollin(comp_fd),
            sys::pollin(cm_fd),
            sys::pollin(async_fd),
            sys::pollin(wake_fd),
        ];
        let mut timeout = cm::next_timeout_ms(&s);
        // While a consumer sleeps on the completion channel itself (`drive`), it handles
        // every CQ event of the IA: stay off the channel, so a completion wakes one thread,
        // and look again soon (the consumer may leave with no event pending).
        if s.drivers.load(Ordering::SeqCst) > 0 {
            fds[0].fd = -1;
            timeout = if timeout < 0 {
                DRIVER_RECHECK_MS
            } else {
                timeout.min(DRIVER_RECHECK_MS)
            };
        }
        // SAFETY: four pollfds (a negative fd is ignored).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, timeout) };
        if n < 0 {
            if sys::errno() == libc::EINTR {
                continue;
            }
            log::error!("verbs event loop: poll failed: {}", sys::errno());
            break;
        }
        if fds[3].revents != 0 {
            sys::eventfd_clear(&s.wake);
        }
        if fds[0].revents != 0 {
            cq::completion_events(&s);
        }
        if fds[1].revents != 0 {
            cm::events(&s);
        }
        if fds[2].revents != 0 {
            async_events(&s);
        }
        cm::expire(&s);
        let work: Vec<Deferred> = std::mem::take(&mut *s.deferred.lock());
        for d in work {
            match d {
                Deferred::Event(ev) => s.emit(ev),
                Deferred::Break(qp_num) => cm::break_connection(&s, qp_num),
            }
        }
    }
}

/// Device asynchronous events: a QP that failed breaks its connection.
fn async_events(s: &Arc<Shared>) {
    loop {
        // SAFETY: plain data.
        let mut ev: ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: the device's non-blocking async descriptor.
        if unsafe { ibv_get_async_event(s.ctx.0, &mut ev) } != 0 {
            break;
        }
        let ty = ev.event_type;
        use ibv_event_type::*;
        if fault::device_event(s, &ev) {
            // SAFETY: the event we got.
            unsafe { ibv_ack_async_event(&mut ev) };
            continue;
        }
        match ty {
            IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR => {
                // SAFETY: a QP event carries the QP.
                let qp_num = unsafe { (*ev.element.qp).qp_num };
                log::debug!("verbs: async {:?} on QP {qp_num}", ty as u32);
                // The event belongs to whichever IA owns the QP (IAs share the descriptor).
                let key = (s.ctx.0 as usize, qp_num);
                let owner = all_qps().lock().get(&key).and_then(|w| w.upgrade());
                if let Some(qp) = owner {
                    if !qp.broken.swap(true, Ordering::SeqCst) {
                        qp.shared.defer_break(qp_num);
                    }
                }
            }
            other => log::debug!("verbs: async event {}", other as u32),
        }
        // SAFETY: the event we got.
        unsafe { ibv_ack_async_event(&mut ev) };
    }
}
