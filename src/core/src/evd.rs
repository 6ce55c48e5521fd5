//! EVD: the event queue of DAT. Provider events (DTO and bind completions drained from the EVD's
//! completion queue, connection events, CR arrivals, async errors) and software events land here;
//! consumers wait with a threshold and timeout, or dequeue.
//!
//! Overflow: provider-generated events are never dropped (dropping a completion would lose the
//! consumer's posted work silently). When the queue holds more than `qlen` events the EVD is
//! marked overflowed and one DAT_ASYNC_ERROR_EVD_OVERFLOW is sent to the IA's async EVD.
//! Software events (dat_evd_post_se) are refused with DAT_QUEUE_FULL instead.
//!
//! Notification. Every queued event is either a notification event or not. Only a notification
//! event wakes a waiter (whose threshold must also be met) or triggers the EVD's CNO; every
//! event, either kind, is counted in the queue (threshold, `nmore`) and returned by
//! dat_evd_dequeue and dat_evd_wait in arrival order. By default every event is a notification
//! event. The exception is DAT_COMPLETION_SOLICITED_WAIT_FLAG in an EP's
//! recv_completion_flags: then a successful receive completion of that EP (a send or a write
//! with immediate data consumed a receive) is a notification event only if the peer posted it
//! with DAT_COMPLETION_SOLICITED_WAIT_FLAG; an unsolicited one is queued without waking anyone,
//! and a failed or flushed receive always notifies (as an InfiniBand CQ armed for solicited
//! completions reports errors). A waiter, whenever it checks, returns when at least
//! `threshold` events are queued and at least one notification event is among them (the
//! newest one has not been dequeued yet): so an unsolicited receive, queued before the wait or
//! during it, is returned once a solicited one follows it, and not before.
//!
//! Threshold. With DAT_COMPLETION_DEFAULT_FLAG or DAT_COMPLETION_EVD_THRESHOLD_FLAG every
//! completion notifies, and the waiter's threshold decides when it unblocks (the two flags
//! behave alike here; EVD_THRESHOLD excludes the consumer-controlled modes, see
//! `EpAttr::validate`). DAT requires threshold 1 on an EVD that a DTO stream with
//! consumer-controlled notification feeds (the receive EVD of an EP whose
//! recv_completion_flags are SOLICITED_WAIT or UNSIGNALLED, the request EVD of an EP whose
//! request_completion_flags are UNSIGNALLED): a larger threshold is DAT_INVALID_STATE
//! (DAT_INVALID_STATE_EVD_CONFIG_SOLICITED, DAT_INVALID_STATE_EVD_CONFIG_NOTIFY for
//! UNSIGNALLED).
//!
//! Backends: the TCP backend carries the sender's solicited bit with the message. An ibverbs
//! work completion carries no such bit, so the verbs backend reports every receive as
//! solicited: on verbs a SOLICITED_WAIT receive EVD notifies on every receive, as the default.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::cno::{deadline_from, Cno};
use super::completion;
use super::consts::{evd_flags, evd_state, event_number};
use super::counters::{self, Counters};
use super::error::{DatError, DatResult, Param, SubType};
pub use super::event::{DtoExt, Event, EventData, EventSlot, UdConnExt};
use super::handle_table::{self, AnyObject, Handle, HandleKind};
use super::ia::{EventQueue, Ia};
use super::use_count::UseCount;
use daplrs_backend::{CompletionQueue, WorkCompletion};

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
    /// The thread in `drive` (see `thread_token`): events it queues itself, from the drive
    /// (a completion the drive's own poll found), need no interrupt; it looks at the queue
    /// as soon as the drive returns.
    driver: u64,
    cno: Option<Arc<Cno>>,
    overflowed: bool,
    freed: bool,
    /// Events ever queued and ever removed (dequeued, waited for, cleared): event number k
    /// (1-based, in arrival order) is still queued iff k > `popped`.
    pushed: u64,
    popped: u64,
    /// The arrival number of the newest notification event (0: none yet). A notification
    /// event is queued iff `last_notify > popped` (the queue is FIFO).
    last_notify: u64,
}

impl EvdState {
    /// Appends an event; `notify` says whether it is a notification event. Returns whether
    /// the queue went past its length with it just now (marked `overflowed`, reported once
    /// until a dequeue leaves it below).
    fn enqueue(&mut self, event: Event, notify: bool) -> bool {
        let overflow_now = self.queue.len() >= self.qlen && !self.overflowed;
        if overflow_now {
            self.overflowed = true;
        }
        self.queue.push_back(event);
        self.pushed += 1;
        if notify {
            self.last_notify = self.pushed;
        }
        overflow_now
    }

    fn dequeue(&mut self) -> Option<Event> {
        let ev = self.queue.pop_front()?;
        self.popped += 1;
        Some(ev)
    }

    /// Whether a waiter with the current threshold may return now (see the module's
    /// notification rules).
    fn ready(&self) -> bool {
        self.queue.len() >= self.threshold && self.last_notify > self.popped
    }
}

/// A small id of the calling thread (never 0).
fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static ME: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    ME.with(|m| *m)
}

/// Whether a drain may hand its first event straight to its caller rather than queue it:
/// only with the queue empty (so the event is the next one in arrival order) and only when the
/// caller would return that event at once.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Take {
    None,
    /// dat_evd_dequeue: any event.
    Dequeue,
    /// dat_evd_wait with threshold 1: a notification event, on a waitable EVD with no waiter
    /// (the checks the wait would make before returning it).
    Wait,
    /// The waiter of a dat_evd_wait with threshold 1, after its drive: a notification event
    /// on a waitable EVD.
    Waiter,
}

/// What in an EVD's state keeps `Evd::queue_event` from handing an event to its taker without
/// the state lock (bits of `Evd::take_blocks`). With none of them, and the queue empty, a
/// taken event changes nothing in the state: it is counted as queued and removed at once,
/// which leaves the counts as they were, and nobody is to be told of it.
struct Blocks;

impl Blocks {
    /// A CNO: a notification event taken may have to trigger it.
    const CNO: u8 = 1;
    /// A waiter: a threshold-1 wait of another thread may not take the event.
    const WAITER: u8 = 2;
    const UNWAITABLE: u8 = 4;
    const FREED: u8 = 8;

    fn of(s: &EvdState) -> u8 {
        let mut b = 0;
        if s.cno.is_some() {
            b |= Self::CNO;
        }
        if s.waiter {
            b |= Self::WAITER;
        }
        if !s.waitable {
            b |= Self::UNWAITABLE;
        }
        if s.freed {
            b |= Self::FREED;
        }
        b
    }
}

/// What `Evd::queue_event` did with an event.
enum Queued {
    /// Written to the caller's slot as dequeued.
    Taken,
    /// Queued; the queue's length after it.
    Queued(usize),
}

/// How many converted events a drain holds before it queues them (`Evd::queue_events`): the
/// buffer stays small (1.3 KiB) whatever the CQ's batch.
const EVENTS_AT_ONCE: usize = 16;

/// A drain's buffers, behind the lock that keeps concurrent drains in CQ order: the
/// completions of one poll, and their events waiting to be queued together.
#[derive(Default)]
struct DrainBufs {
    completions: Vec<WorkCompletion>,
    events: Vec<(Event, bool)>,
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
    drain_lock: Mutex<DrainBufs>,
    /// The thread whose `wait` is in `CompletionQueue::drive` now (0: none), readable without
    /// the state lock: the CQ's notification, when that thread's own drive raises it, leaves
    /// the completions to the wait, which drains them as the drive returns (see `wait`).
    driven_by: AtomicU64,
    /// The queue's length as last left under the state lock, readable without it: a dequeue
    /// that finds events queued returns the first of them without polling the CQ (whatever
    /// the CQ holds arrived after them).
    backlog: AtomicUsize,
    /// What keeps a drain from handing its first event straight to its taker without the
    /// state lock (`Blocks`), mirrored from the state under that lock (`mirror`).
    take_blocks: AtomicU8,
    /// EPs, PSPs, RSPs using this EVD.
    pub(crate) users: UseCount,
    /// DCNT_EVD_* (see `counters`).
    pub(crate) counters: Counters,
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
            return Err(DatError::bad(Param::EvdMinQlen));
        }
        if flags == 0 || flags & !evd_flags::ALL != 0 {
            return Err(DatError::bad(Param::EvdFlags));
        }
        ia.check_room(
            HandleKind::Evd,
            ia.device().attr().max_cq,
            SubType::ResourceTevd,
        )?;
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
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        let reservation = ia.reserve(HandleKind::Evd);
        let evd = Arc::new(Evd {
            handle: reservation.handle(),
            ia: ia.clone(),
            counters: Counters::new(counters::evd::ALL),
            flags,
            state: Mutex::new(EvdState {
                queue: VecDeque::with_capacity(qlen as usize),
                qlen: qlen as usize,
                enabled: true,
                waitable: true,
                waiter: false,
                threshold: 1,
                driving: false,
                driver: 0,
                cno,
                overflowed: false,
                freed: false,
                pushed: 0,
                popped: 0,
                last_notify: 0,
            }),
            cond: Condvar::new(),
            cq,
            drain_lock: Mutex::new(DrainBufs::default()),
            driven_by: AtomicU64::new(0),
            backlog: AtomicUsize::new(0),
            take_blocks: AtomicU8::new(0),
            users: UseCount::default(),
        });
        if let Some(cq) = &evd.cq {
            let weak: Weak<Evd> = Arc::downgrade(&evd);
            cq.set_notify(Some(Arc::new(move || {
                if let Some(evd) = weak.upgrade() {
                    // The waiter's own drive: it drains as soon as the drive returns.
                    if evd.driven_by.load(Ordering::Relaxed) == thread_token() {
                        return;
                    }
                    evd.drain_cq();
                }
            })));
            // A CNO's waiter learns of completions only if they reach the EVD by themselves.
            cq.set_events_wanted(evd.state.lock().cno.is_some());
        }
        evd.mirror(&evd.state.lock());
        ia.commit(reservation, &evd);
        if flags & evd_flags::ASYNC != 0 {
            ia.adopt_async_evd(&evd, false);
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
        if let Some(cq) = &self.cq {
            self.drain_with(cq, Take::None, &mut None::<Event>);
        }
    }

    /// Moves completions from the CQ into the event queue, in CQ order. With `take`, the
    /// first event goes straight to the caller's `taken` (empty on entry) instead when the
    /// queue is empty and the caller would dequeue it at once (see `Take`): the same event,
    /// in the same order, without its round trip through the queue, written once where the
    /// caller reads it (returned by value it was moved three times on its way out). Returns
    /// how many events are queued behind a taken one.
    ///
    /// Inlined: an EVD with no CQ (a connection EVD polled while it connects) answers here,
    /// not after a call's prologue.
    #[inline(always)]
    fn drain(&self, take: Take, taken: &mut impl EventSlot) -> usize {
        match &self.cq {
            Some(cq) => self.drain_taking(cq, take, taken),
            None => 0,
        }
    }

    /// `drain` of an EVD that has a CQ: one copy of the drain for the calls that take.
    #[inline(never)]
    fn drain_taking(
        &self,
        cq: &Arc<dyn CompletionQueue>,
        take: Take,
        taken: &mut impl EventSlot,
    ) -> usize {
        self.drain_with(cq, take, taken)
    }

    /// `drain` of `cq` (the EVD's), inlined into it and into `drain_cq`: there, with nothing
    /// to take, the take's path is compiled out (it cost the notification's drain 19
    /// instructions per event).
    #[inline(always)]
    fn drain_with(
        &self,
        cq: &Arc<dyn CompletionQueue>,
        mut take: Take,
        taken: &mut impl EventSlot,
    ) -> usize {
        const BATCH: usize = 64;
        let mut behind = 0;
        let mut bufs = self.drain_lock.lock();
        let DrainBufs {
            completions: batch,
            events,
        } = &mut *bufs;
        loop {
            batch.clear();
            let n = cq.poll(BATCH, batch);
            // One completion is queued as it comes: through the buffer it costs more.
            let single = n == 1;
            // Read in place (the batch is cleared at the next poll): moved out, each
            // completion was copied once more: 18 to 23 instructions a same-host DTO (cost
            // guard), 25 to 27 a blocking verbs read or write (bench-cost).
            for wc in batch.iter() {
                let Some((ev, notify)) = completion::event(&self.ia, wc, self.handle) else {
                    continue;
                };
                // Only the first event may be taken: a later one would overtake it.
                let take = std::mem::replace(&mut take, Take::None);
                // Taken without the state lock, written here: the event is built once, in the
                // caller's slot (through `queue_event` it was copied twice on the way and the
                // call cost a blocking read's wait 50 instructions).
                if self.takes_unlocked(take, notify) {
                    taken.put(ev);
                    continue;
                }
                if take != Take::None || single {
                    if let Queued::Queued(len) = self.queue_event(ev, notify, take, taken) {
                        behind = len;
                    }
                    continue;
                }
                events.push((ev, notify));
                if events.len() == EVENTS_AT_ONCE {
                    behind = self.queue_events(events);
                }
            }
            if !events.is_empty() {
                behind = self.queue_events(events);
            }
            // A short batch emptied the CQ as it was: no second look (a poll of an empty
            // hardware queue each time).
            if n < BATCH {
                break;
            }
        }
        behind
    }

    /// Queues `events` (emptied) in order under one hold of the state lock, with what
    /// `queue_event` does for each of them with nothing to take: the waiter woken, the CNO
    /// triggered and an overflow reported once for all of them. A poll of many completions
    /// (a window of requests in flight) took and released the lock once per event, and
    /// triggered a CNO's socket once per event. Returns the queue's length after them.
    fn queue_events(&self, events: &mut Vec<(Event, bool)>) -> usize {
        let mut overflow_now = false;
        let mut notified = false;
        let (cno, driving, len) = {
            let mut s = self.state.lock();
            if s.freed {
                events.clear();
                return 0;
            }
            for (event, notify) in events.drain(..) {
                overflow_now |= s.enqueue(event, notify);
                notified |= notify;
            }
            self.backlog.store(s.queue.len(), Ordering::Relaxed);
            let cno = if notified { self.after_push(&s) } else { None };
            let driving = s.driving && s.driver != thread_token();
            (cno, driving, s.queue.len())
        };
        self.announce(notified, driving, cno, overflow_now);
        len
    }

    /// Queues a provider-generated notification event (never dropped).
    pub(crate) fn push_provider(&self, event: Event) {
        self.push(event, true);
    }

    /// Queues a provider-generated event (never dropped); `notify`: whether it is a
    /// notification event (wakes the waiter, triggers the CNO).
    pub(crate) fn push(&self, event: Event, notify: bool) {
        self.queue_event(event, notify, Take::None, &mut None::<Event>);
    }

    /// Keeps `take_blocks` as `s` says (called under the state lock after a change of the
    /// fields `Blocks` reads).
    fn mirror(&self, s: &EvdState) {
        self.take_blocks.store(Blocks::of(s), Ordering::Relaxed);
    }

    /// Whether `take` may have the event (a notification event or not: `notify`) without the
    /// state lock: the queue is empty and nothing in the state wants to know (`Blocks`). A
    /// change racing with this look (an event queued by a provider, a waiter, a CNO) orders
    /// after it, as if it came after the take.
    #[inline(always)]
    fn takes_unlocked(&self, take: Take, notify: bool) -> bool {
        let blocks = self.take_blocks.load(Ordering::Relaxed);
        let allowed = match take {
            Take::None => return false,
            Take::Dequeue => blocks & (Blocks::CNO | Blocks::FREED) == 0,
            Take::Wait => notify && blocks == 0,
            // The waiter is this thread, whose wait ignores the CNO (DAT notifies the CNO of
            // an EVD with no waiter of its own).
            Take::Waiter => notify && blocks & (Blocks::UNWAITABLE | Blocks::FREED) == 0,
        };
        allowed && self.backlog.load(Ordering::Relaxed) == 0
    }

    /// Queues a provider-generated event, or writes it to `taken` as dequeued when `take`
    /// allows (see `Take`). A taken event is accounted for as one queued and removed at once:
    /// it counts as a notification event that was dequeued, and triggers the CNO as a queued
    /// one does.
    fn queue_event(
        &self,
        event: Event,
        notify: bool,
        take: Take,
        taken: &mut impl EventSlot,
    ) -> Queued {
        if self.takes_unlocked(take, notify) {
            taken.put(event);
            return Queued::Taken;
        }
        let overflow_now;
        let cno_to_trigger;
        let driving;
        let len;
        {
            let mut s = self.state.lock();
            if s.freed {
                return Queued::Queued(0);
            }
            let taking = s.queue.is_empty()
                && match take {
                    Take::None => false,
                    Take::Dequeue => true,
                    Take::Wait => notify && s.waitable && !s.waiter,
                    Take::Waiter => notify && s.waitable,
                };
            if taking {
                s.pushed += 1;
                s.popped += 1;
                if notify {
                    s.last_notify = s.pushed;
                }
                // What the dequeue or wait does when it leaves the queue below its length.
                s.overflowed = false;
                let cno = if notify { self.after_push(&s) } else { None };
                drop(s);
                // No waiter to wake: the event is gone already (a waiter of another thread,
                // under dat_evd_dequeue's race, would find the queue empty).
                if let Some(cno) = cno {
                    cno.trigger(self.handle);
                }
                taken.put(event);
                return Queued::Taken;
            }
            overflow_now = s.enqueue(event, notify);
            self.backlog.store(s.queue.len(), Ordering::Relaxed);
            cno_to_trigger = if notify { self.after_push(&s) } else { None };
            driving = s.driving && s.driver != thread_token();
            len = s.queue.len();
        }
        self.announce(notify, driving, cno_to_trigger, overflow_now);
        Queued::Queued(len)
    }

    /// What queueing leaves for after the state lock: the waiter woken if a notification
    /// event came (`driving`: it waits in its CQ's drive), the CNO triggered, and an overflow
    /// reported (once until a dequeue leaves the queue below its length).
    /// Inlined: as a call of its own it cost each queued event 18 instructions.
    #[inline(always)]
    fn announce(&self, notified: bool, driving: bool, cno: Option<Arc<Cno>>, overflowed: bool) {
        if notified {
            self.wake_waiter(driving);
        }
        if let Some(cno) = cno {
            cno.trigger(self.handle);
        }
        if overflowed {
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
                return Err(DatError::bad_handle(Param::EvdHandle));
            }
            if s.queue.len() >= s.qlen {
                return Err(DatError::queue_full());
            }
            // Never past its length: a full queue refused the event above.
            let _ = s.enqueue(
                Event {
                    number: event_number::SOFTWARE,
                    evd: self.handle,
                    data: EventData::Software { pointer },
                },
                true,
            );
            self.backlog.store(s.queue.len(), Ordering::Relaxed);
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
        let mut ev = None;
        self.dequeue_into(&mut ev)?;
        ev.ok_or_else(DatError::internal)
    }

    /// dat_evd_dequeue, the event put into `out` (empty on entry; see `EventSlot`): once,
    /// where the caller reads it, instead of moved out through return values.
    pub fn dequeue_into(&self, out: &mut impl EventSlot) -> DatResult<()> {
        // DEQUEUE is FOUND + NOT_FOUND, summed where the counters are read (ext.rs).
        // With events queued (the rest of the batch a former poll found), the first of them
        // is the answer: no poll of the CQ, whose completions all came after them. A stale
        // count is settled under the lock (`dequeue_queued`). With none, the CQ's first
        // completion is the answer.
        let skipped = self.backlog.load(Ordering::Relaxed) != 0;
        if !skipped {
            self.drain(Take::Dequeue, out);
            if out.is_filled() {
                self.counters.inc(counters::evd::DEQUEUE_FOUND);
                return Ok(());
            }
            // A poller: let the transport read what arrived on this thread (see
            // `CompletionQueue::progress`), then look once more.
            if let Some(cq) = &self.cq {
                if cq.progress() {
                    self.drain(Take::Dequeue, out);
                    if out.is_filled() {
                        self.counters.inc(counters::evd::DEQUEUE_FOUND);
                        return Ok(());
                    }
                }
            }
            // Still nothing queued: empty, said without the EVD's lock (an event queued
            // meanwhile came after this look).
            if self.backlog.load(Ordering::Relaxed) == 0 {
                self.counters.inc(counters::evd::DEQUEUE_NOT_FOUND);
                return Err(DatError::queue_empty());
            }
        }
        self.dequeue_queued(out, skipped)
    }

    /// `dequeue_into` from the event queue, under its lock. `skipped`: the CQ was not looked
    /// at for the count of events queued, which another thread's dequeue may have made stale;
    /// if the queue is empty it is looked at once now.
    fn dequeue_queued(&self, out: &mut impl EventSlot, skipped: bool) -> DatResult<()> {
        let mut s = self.state.lock();
        if s.queue.is_empty() && skipped {
            MutexGuard::unlocked(&mut s, || {
                if let Some(cq) = &self.cq {
                    cq.progress();
                }
                self.drain_cq();
            });
        }
        let Some(event) = s.dequeue() else {
            self.counters.inc(counters::evd::DEQUEUE_NOT_FOUND);
            return Err(DatError::queue_empty());
        };
        out.put(event);
        self.backlog.store(s.queue.len(), Ordering::Relaxed);
        self.counters.inc(counters::evd::DEQUEUE_FOUND);
        if s.queue.len() < s.qlen {
            s.overflowed = false;
        }
        Ok(())
    }

    /// dat_evd_wait (`Evd::wait`, in ep.rs): waits until `threshold` events are queued with a
    /// notification event among them (see the module's rules) or `timeout_us` passes, writes
    /// the first event to `out` (empty on entry) as in `dequeue_into` and returns how many
    /// remain. With a threshold above 1, `controlled` says which consumer-controlled DTO
    /// stream feeds the EVD, if one does: DAT_INVALID_STATE with that subtype (the EPs know;
    /// asked without the EVD's state lock, as they take EP locks).
    pub(crate) fn wait_with(
        &self,
        timeout_us: u32,
        threshold: i32,
        out: &mut impl EventSlot,
        controlled: impl FnOnce() -> Option<SubType>,
    ) -> DatResult<usize> {
        self.counters.inc(counters::evd::WAIT);
        if threshold == 1 {
            // Threshold 1 returns the first notification event: one the drain finds with
            // the queue empty is returned as it comes (see `Take::Wait`).
            let behind = self.drain(Take::Wait, out);
            if out.is_filled() {
                return Ok(behind);
            }
        } else {
            self.drain_cq();
        }
        let deadline = deadline_from(timeout_us);
        let controlled = if threshold > 1 { controlled() } else { None };
        let mut s = self.state.lock();
        if threshold <= 0 || threshold as usize > s.qlen {
            return Err(DatError::bad(Param::Threshold));
        }
        if let Some(sub) = controlled {
            return Err(DatError::invalid_state(sub));
        }
        if !s.waitable {
            return Err(DatError::invalid_state(SubType::EvdUnwaitable));
        }
        if s.waiter {
            return Err(DatError::invalid_state(SubType::EvdWaiter));
        }
        s.waiter = true;
        self.mirror(&s);
        s.threshold = threshold as usize;
        // Whether to try `drive` before the next condition-variable wait.
        let mut drive = true;
        // Whether the deadline was just computed from a timeout above 0: not passed, so the
        // first drive does not read the clock to check it.
        let mut fresh = timeout_us != 0;
        // Whether `drive` ran: `end_drive` is then owed before this thread leaves or blocks.
        let mut drove = false;
        let result = loop {
            if s.freed {
                break Err(DatError::bad_handle(Param::EvdHandle));
            }
            if s.ready() {
                let event = s.dequeue();
                self.backlog.store(s.queue.len(), Ordering::Relaxed);
                match event {
                    Some(event) => {
                        out.put(event);
                        break Ok(s.queue.len());
                    }
                    None => break Err(DatError::internal()),
                }
            }
            if !s.waitable {
                break Err(DatError::invalid_state(SubType::EvdUnwaitable));
            }
            if let (Some(cq), true) = (&self.cq, drive) {
                if !std::mem::take(&mut fresh)
                    && deadline.is_some_and(|d| std::time::Instant::now() >= d)
                {
                    break Err(DatError::timeout());
                }
                // Wait by running the transport for our own connections (see
                // `CompletionQueue::drive`); the condition variable when it cannot. Either
                // way the state lock was released meanwhile: look at the queue again first.
                let me = thread_token();
                s.driving = true;
                s.driver = me;
                self.driven_by.store(me, Ordering::Relaxed);
                drive = MutexGuard::unlocked(&mut s, || cq.drive(deadline));
                self.driven_by.store(0, Ordering::Relaxed);
                s.driving = false;
                drove = true;
                // What the drive found on this thread was left in the CQ for this wait (see the
                // CQ's notification in `create`): drained now, with threshold 1 the first
                // event straight to this waiter when the queue is empty.
                if s.threshold == 1 {
                    let behind = MutexGuard::unlocked(&mut s, || self.drain(Take::Waiter, out));
                    if out.is_filled() {
                        break Ok(behind);
                    }
                } else {
                    MutexGuard::unlocked(&mut s, || self.drain_cq());
                }
                continue;
            }
            if let (Some(cq), true) = (&self.cq, drove) {
                drove = false;
                MutexGuard::unlocked(&mut s, || cq.end_drive());
                continue;
            }
            self.counters.inc(counters::evd::WAIT_BLOCKED);
            match deadline {
                None => self.cond.wait(&mut s),
                Some(d) => {
                    if self.cond.wait_until(&mut s, d).timed_out() && !s.ready() {
                        break Err(DatError::timeout());
                    }
                }
            }
            drive = true;
        };
        if let (Some(cq), true) = (&self.cq, drove) {
            MutexGuard::unlocked(&mut s, || cq.end_drive());
        }
        s.waiter = false;
        self.mirror(&s);
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
            self.mirror(&s);
            s.driving
        };
        self.wake_waiter(driving);
    }

    /// dat_evd_resize.
    pub fn resize(&self, qlen: i32) -> DatResult<()> {
        if qlen <= 0 || qlen as u32 > self.ia.device().attr().max_cqe {
            return Err(DatError::bad(Param::EvdQlen));
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
        let wanted = cno.is_some();
        let old = {
            let mut s = self.state.lock();
            let old = std::mem::replace(&mut s.cno, cno);
            self.mirror(&s);
            old
        };
        if let Some(old) = old {
            old.users.release();
        }
        if let Some(cq) = &self.cq {
            cq.set_events_wanted(wanted);
        }
        Ok(())
    }

    /// dat_evd_free: refused while an EP, PSP or RSP uses the EVD.
    pub fn free(self: &Arc<Self>) -> DatResult<()> {
        if !handle_table::is_live(self.handle) {
            return Err(DatError::bad_handle(Param::EvdHandle));
        }
        if self.users.retire().is_err() {
            return Err(DatError::invalid_state(SubType::EvdInUse));
        }
        if self.state.lock().waiter {
            // Undo the retirement: the EVD stays usable.
            self.users.release_retire();
            return Err(DatError::invalid_state(SubType::EvdWaiter));
        }
        self.ia.remove(self.handle, HandleKind::Evd)?;
        self.destroy();
        Ok(())
    }

    pub(crate) fn destroy(&self) {
        self.users.force_retire();
        if let Some(cq) = &self.cq {
            cq.set_notify(None);
            // What the CQ still holds is never reported: its records end here (a receive's
            // holds a reference to its EP's counters, `Received`).
            let mut bufs = self.drain_lock.lock();
            let batch = &mut bufs.completions;
            batch.clear();
            while cq.poll(64, batch) > 0 {
                for wc in batch.drain(..) {
                    completion::retire(&self.ia, &wc);
                }
            }
        }
        let (cno, driving) = {
            let mut s = self.state.lock();
            s.freed = true;
            s.queue.clear();
            self.backlog.store(0, Ordering::Relaxed);
            s.popped = s.pushed;
            let cno = s.cno.take();
            self.mirror(&s);
            (cno, s.driving)
        };
        self.wake_waiter(driving);
        if let Some(c) = cno {
            c.users.release();
        }
        self.ia.forget_async_evd(self.handle);
    }
}

impl EventQueue for Evd {
    fn handle(&self) -> Handle {
        self.handle
    }
    fn push_provider(&self, event: Event) {
        Evd::push_provider(self, event);
    }
    fn into_any(self: Arc<Self>) -> Arc<AnyObject> {
        self
    }
}

impl Ia {
    /// The async EVD, if the IA has one.
    pub fn async_evd(&self) -> Option<Arc<Evd>> {
        self.async_queue()?.into_any().downcast().ok()
    }
}
