//! EVD: the event queue of DAT. Provider events (DTO and bind completions drained from the EVD's
//! completion queue, connection events, CR arrivals, async errors) and software events land here;
//! consumers wait with a threshold and timeout, or dequeue.
//!
//! Overflow: provider-generated events are never dropped (dropping a completion would lose the
//! consumer's posted work silently). When the queue holds more than `qlen` events the EVD is
//! marked overflowed and one DAT_ASYNC_ERROR_EVD_OVERFLOW is sent to the IA's async EVD.
//! Software events (dat_evd_post_se) are refused with DAT_QUEUE_FULL instead.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::{Arc, Weak};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::cno::{deadline_from, Cno};
use super::consts::{evd_flags, evd_state, event_number};
use super::error::{DatError, DatResult, SubType};
use super::handle::{self, Handle, HandleKind, Object, UseCount};
use super::ia::Ia;
use crate::backend::{CompletionQueue, WorkCompletion};

/// The payload of an event; handles are the values C sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventData {
    Dto {
        ep: Handle,
        cookie: u64,
        status: u32,
        transferred: u32,
        op: u32,
        rmr_context: u32,
    },
    RmrBind {
        rmr: Handle,
        cookie: u64,
        status: u32,
    },
    CrArrival {
        sp: Handle,
        local_addr: Ipv4Addr,
        conn_qual: u64,
        cr: Handle,
    },
    /// The private data stays owned by the EP (see `Ep::peer_private_data`) for as long as the
    /// ffi layer needs a stable pointer to it.
    Connection {
        ep: Handle,
        private_data: Arc<[u8]>,
    },
    Async {
        handle: Handle,
        reason: u32,
    },
    Software {
        pointer: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub number: u32,
    pub evd: Handle,
    pub data: EventData,
}

struct EvdState {
    queue: VecDeque<Event>,
    qlen: usize,
    enabled: bool,
    waitable: bool,
    /// A thread is in `wait` (DAT allows one).
    waiter: bool,
    /// Threshold of the current waiter.
    threshold: usize,
    /// The waiter is in `CompletionQueue::drive`, not on the condition variable: whoever
    /// queues an event or changes what it waits for must also interrupt the drive.
    driving: bool,
    cno: Option<Arc<Cno>>,
    overflowed: bool,
    freed: bool,
}

pub struct Evd {
    handle: Handle,
    ia: Arc<Ia>,
    flags: u32,
    state: Mutex<EvdState>,
    cond: Condvar,
    /// Completion queue feeding DTO/RMR-bind events; created for EVDs with those flags.
    cq: Option<Arc<dyn CompletionQueue>>,
    /// Serialises CQ drains so completions enter the queue in CQ order.
    drain_lock: Mutex<Vec<WorkCompletion>>,
    /// EPs, PSPs, RSPs using this EVD.
    pub(crate) users: UseCount,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvdParam {
    pub ia: Handle,
    pub qlen: usize,
    /// evd_state bits: ENABLED/DISABLED | WAITABLE/UNWAITABLE.
    pub state: u32,
    pub cno: Handle,
    pub flags: u32,
}

impl Evd {
    /// dat_evd_create.
    pub fn create(
        ia: &Arc<Ia>,
        qlen: i32,
        cno: Option<Arc<Cno>>,
        flags: u32,
    ) -> DatResult<Arc<Evd>> {
        ia.check_open()?;
        if qlen <= 0 || qlen as u32 > ia.device().attr().max_cqe {
            return Err(DatError::invalid_arg(2));
        }
        if flags == 0 || flags & !evd_flags::ALL != 0 {
            return Err(DatError::invalid_arg(4));
        }
        if let Some(c) = &cno {
            if !c.users.acquire() {
                return Err(HandleKind::Cno.invalid());
            }
        }
        let cq = if flags & (evd_flags::DTO | evd_flags::RMR_BIND) != 0 {
            match ia.device().create_cq(qlen as u32) {
                Ok(cq) => Some(cq),
                Err(e) => {
                    if let Some(c) = &cno {
                        c.users.release();
                    }
                    return Err(e);
                }
            }
        } else {
            None
        };
        let reservation = handle::reserve(HandleKind::Evd);
        let evd = Arc::new(Evd {
            handle: reservation.handle(),
            ia: ia.clone(),
            flags,
            state: Mutex::new(EvdState {
                queue: VecDeque::with_capacity(qlen as usize),
                qlen: qlen as usize,
                enabled: true,
                waitable: true,
                waiter: false,
                threshold: 1,
                driving: false,
                cno,
                overflowed: false,
                freed: false,
            }),
            cond: Condvar::new(),
            cq,
            drain_lock: Mutex::new(Vec::new()),
            users: UseCount::default(),
        });
        if let Some(cq) = &evd.cq {
            let weak: Weak<Evd> = Arc::downgrade(&evd);
            cq.set_notify(Some(Arc::new(move || {
                if let Some(evd) = weak.upgrade() {
                    evd.drain_cq();
                }
            })));
        }
        reservation.commit(Object::Evd(evd.clone()), ia.handle());
        if flags & evd_flags::ASYNC != 0 {
            ia.adopt_async_evd(&evd);
        }
        Ok(evd)
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }
    pub fn flags(&self) -> u32 {
        self.flags
    }
    pub fn ia(&self) -> &Arc<Ia> {
        &self.ia
    }
    pub(crate) fn cq(&self) -> Option<&Arc<dyn CompletionQueue>> {
        self.cq.as_ref()
    }

    pub fn query(&self) -> EvdParam {
        let s = self.state.lock();
        EvdParam {
            ia: self.ia.handle(),
            qlen: s.qlen,
            state: (if s.enabled {
                evd_state::ENABLED
            } else {
                evd_state::DISABLED
            }) | (if s.waitable {
                evd_state::WAITABLE
            } else {
                evd_state::UNWAITABLE
            }),
            cno: s.cno.as_ref().map(|c| c.handle()).unwrap_or(Handle::NULL),
            flags: self.flags,
        }
    }

    /// Events currently queued (the ffi fills `nmore` from this after a timeout).
    pub fn len(&self) -> usize {
        self.drain_cq();
        self.state.lock().queue.len()
    }

    /// Whether a thread is blocked in `wait` (DAT allows one waiter).
    pub fn has_waiter(&self) -> bool {
        self.state.lock().waiter
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves completions from the CQ into the event queue.
    pub(crate) fn drain_cq(&self) {
        let Some(cq) = &self.cq else { return };
        let mut batch = self.drain_lock.lock();
        loop {
            batch.clear();
            if cq.poll(64, &mut batch) == 0 {
                break;
            }
            for wc in batch.drain(..) {
                if let Some(ev) = self.ia.dto_event(&wc, self.handle) {
                    self.push_provider(ev);
                }
            }
        }
    }

    /// Queues a provider-generated event (never dropped).
    pub(crate) fn push_provider(&self, event: Event) {
        let mut overflow_now = false;
        let cno_to_trigger;
        let driving;
        {
            let mut s = self.state.lock();
            if s.freed {
                return;
            }
            if s.queue.len() >= s.qlen && !s.overflowed {
                s.overflowed = true;
                overflow_now = true;
            }
            s.queue.push_back(event);
            cno_to_trigger = self.after_push(&s);
            driving = s.driving;
        }
        self.wake_waiter(driving);
        if let Some(cno) = cno_to_trigger {
            cno.trigger(self.handle);
        }
        if overflow_now {
            log::warn!("EVD {:?} overflowed its queue length", self.handle);
            self.ia
                .post_async(event_number::ASYNC_EVD_OVERFLOW, self.handle, self.handle);
        }
    }

    /// Wakes the waiter, wherever it waits.
    fn wake_waiter(&self, driving: bool) {
        self.cond.notify_all();
        if driving {
            if let Some(cq) = &self.cq {
                cq.interrupt();
            }
        }
    }

    /// The CNO to notify after a push: DAT notifies the CNO of an enabled EVD that has no
    /// waiter of its own.
    fn after_push(&self, s: &EvdState) -> Option<Arc<Cno>> {
        if s.enabled && !s.waiter {
            s.cno.clone()
        } else {
            None
        }
    }

    /// dat_evd_post_se.
    pub fn post_se(&self, pointer: u64) -> DatResult<()> {
        let cno;
        let driving;
        {
            let mut s = self.state.lock();
            if s.freed {
                return Err(HandleKind::Evd.invalid());
            }
            if s.queue.len() >= s.qlen {
                return Err(DatError::queue_full());
            }
            s.queue.push_back(Event {
                number: event_number::SOFTWARE,
                evd: self.handle,
                data: EventData::Software { pointer },
            });
            cno = self.after_push(&s);
            driving = s.driving;
        }
        self.wake_waiter(driving);
        if let Some(c) = cno {
            c.trigger(self.handle);
        }
        Ok(())
    }

    /// dat_evd_dequeue.
    pub fn dequeue(&self) -> DatResult<Event> {
        self.drain_cq();
        let mut s = self.state.lock();
        let ev = s.queue.pop_front().ok_or(DatError::queue_empty())?;
        if s.queue.len() < s.qlen {
            s.overflowed = false;
        }
        Ok(ev)
    }

    /// dat_evd_wait: waits until `threshold` events are queued or `timeout_us` passes, then
    /// returns the first event and how many remain.
    pub fn wait(&self, timeout_us: u32, threshold: i32) -> DatResult<(Event, usize)> {
        self.drain_cq();
        let deadline = deadline_from(timeout_us);
        let mut s = self.state.lock();
        if threshold <= 0 || threshold as usize > s.qlen {
            return Err(DatError::invalid_arg(3));
        }
        if !s.waitable {
            return Err(DatError::invalid_state(SubType::EvdUnwaitable));
        }
        if s.waiter {
            return Err(DatError::invalid_state(SubType::EvdWaiter));
        }
        s.waiter = true;
        s.threshold = threshold as usize;
        // Whether to try `drive` before the next condition-variable wait.
        let mut drive = true;
        let result = loop {
            if s.freed {
                break Err(DatError::invalid_handle(SubType::InvalidHandle1));
            }
            if s.queue.len() >= s.threshold {
                let ev = s.queue.pop_front();
                match ev {
                    Some(ev) => break Ok((ev, s.queue.len())),
                    None => break Err(DatError::internal()),
                }
            }
            if !s.waitable {
                break Err(DatError::invalid_state(SubType::EvdUnwaitable));
            }
            if let (Some(cq), true) = (&self.cq, drive) {
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    break Err(DatError::timeout());
                }
                // Wait by running the transport for our own connections (see
                // `CompletionQueue::drive`); the condition variable when it cannot. Either
                // way the state lock was released meanwhile: look at the queue again first.
                s.driving = true;
                drive = MutexGuard::unlocked(&mut s, || cq.drive(deadline));
                s.driving = false;
                continue;
            }
            match deadline {
                None => self.cond.wait(&mut s),
                Some(d) => {
                    if self.cond.wait_until(&mut s, d).timed_out() && s.queue.len() < s.threshold {
                        break Err(DatError::timeout());
                    }
                }
            }
            drive = true;
        };
        s.waiter = false;
        s.threshold = 1;
        if s.queue.len() < s.qlen {
            s.overflowed = false;
        }
        result
    }

    /// dat_evd_enable / dat_evd_disable.
    pub fn set_enabled(&self, enabled: bool) {
        self.state.lock().enabled = enabled;
    }

    /// dat_evd_set_unwaitable / dat_evd_clear_unwaitable. Setting wakes a current waiter, which
    /// returns DAT_INVALID_STATE.
    pub fn set_waitable(&self, waitable: bool) {
        let driving = {
            let mut s = self.state.lock();
            s.waitable = waitable;
            s.driving
        };
        self.wake_waiter(driving);
    }

    /// dat_evd_resize.
    pub fn resize(&self, qlen: i32) -> DatResult<()> {
        if qlen <= 0 || qlen as u32 > self.ia.device().attr().max_cqe {
            return Err(DatError::invalid_arg(2));
        }
        self.drain_cq();
        let mut s = self.state.lock();
        if (qlen as usize) < s.queue.len() {
            return Err(DatError::invalid_state(SubType::None));
        }
        if s.waiter && (qlen as usize) < s.threshold {
            return Err(DatError::invalid_state(SubType::EvdWaiter));
        }
        if let Some(cq) = &self.cq {
            cq.resize(qlen as u32)?;
        }
        s.qlen = qlen as usize;
        s.overflowed = s.queue.len() > s.qlen;
        Ok(())
    }

    /// dat_evd_modify_cno (None detaches).
    pub fn modify_cno(&self, cno: Option<Arc<Cno>>) -> DatResult<()> {
        if let Some(c) = &cno {
            if !c.users.acquire() {
                return Err(HandleKind::Cno.invalid());
            }
        }
        let old = std::mem::replace(&mut self.state.lock().cno, cno);
        if let Some(old) = old {
            old.users.release();
        }
        Ok(())
    }

    /// dat_evd_free: refused while an EP, PSP or RSP uses the EVD.
    pub fn free(self: &Arc<Self>) -> DatResult<()> {
        if !handle::is_live(self.handle) {
            return Err(HandleKind::Evd.invalid());
        }
        if self.users.retire().is_err() {
            return Err(DatError::invalid_state(SubType::EvdInUse));
        }
        if self.state.lock().waiter {
            // Undo the retirement: the EVD stays usable.
            self.users.release_retire();
            return Err(DatError::invalid_state(SubType::EvdWaiter));
        }
        handle::remove(self.handle, HandleKind::Evd)?;
        self.destroy();
        Ok(())
    }

    pub(crate) fn destroy(&self) {
        self.users.force_retire();
        if let Some(cq) = &self.cq {
            cq.set_notify(None);
        }
        let (cno, driving) = {
            let mut s = self.state.lock();
            s.freed = true;
            s.queue.clear();
            (s.cno.take(), s.driving)
        };
        self.wake_waiter(driving);
        if let Some(c) = cno {
            c.users.release();
        }
        self.ia.forget_async_evd(self.handle);
    }
}
