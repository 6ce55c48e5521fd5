//! Signal-driven target service (`DAPLRS_TARGET_SIGNAL`): the kernel interrupts an
//! application thread when a peer's frame arrives on a connection, and a handler of ours
//! places small RDMA writes and sends into registered memory, and answers small RDMA reads
//! from it, right there. A program that spins on its memory with no DAT call holds its CPU
//! until its time slice ends; without this, the progress thread that must place the data
//! waits for that (milliseconds).
//!
//! How: every established connection's socket gets O_ASYNC, F_SETSIG (a real-time signal,
//! so that each event carries its descriptor) and F_SETOWN_EX with F_OWNER_PID (the kernel
//! picks a thread of the process that does not block the signal; our own threads block it),
//! then F_OWNER_TID to the application thread that last posted on it and takes the signal
//! (`Engine::note_poster`): the one likely spinning for the answer, rather than the main
//! thread, which the kernel prefers even asleep in `poll` (it would get EINTR and leave the
//! spinner waiting); back to the process once that thread has exited. The device's ACK
//! timer's signal follows the thread that last took a connection's signal
//! (`direct_ack_timer`), and goes back to the process too when that thread has exited.
//! The handler is async-signal-safe with respect to whatever the interrupted thread does:
//!
//! * it never blocks on a lock: the engine, the key table and a CQ's queue are taken with
//!   `try_lock`; if any is held (by the interrupted thread or another), it returns and the
//!   frame is served as without it (the socket stays in a poll set of the progress thread or
//!   of a waiting thread, which its data wakes; the progress thread is woken besides);
//! * it does not allocate or free (the interrupted thread may be inside malloc): the path it
//!   runs (`Engine::serve_signalled`) uses a stack buffer and capacity reserved beforehand,
//!   and parks what it would free for the next ordinary engine holder; tests count
//!   allocations on a thread that runs it (`tests::sigio`);
//! * it serves nothing if it interrupted this library's own code (which may be inside a
//!   lock's slow path, holding parking_lot's lock table that our unlock could need);
//! * it keeps `errno`, and serves only what is cheap and certain (see `serve_signalled`):
//!   everything else is left in the socket for the usual readers.
//!
//! Input on an armed socket is not watched by the progress thread: handlers read it, or the
//! holder of the engine when a handler found it busy (`Shared::sweep_if_asked`), or the
//! progress thread when a handler left a frame or at its tick. A thread of ours that reads
//! the connection itself turns the signal off meanwhile: a waiter driving it, a poller from
//! its look until it finds a completion (engine/progress.rs, `note_poller`, `rearm_for_cq`).
//!
//! Off unless asked for: a signal interrupts the application's own blocking calls (poll,
//! nanosleep, ... return EINTR whatever SA_RESTART says), and a polling or waiting consumer,
//! which reads its connections itself, gains nothing from it (docs/performance.md).

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// What a handler asks of a device whose connections it serves (shared.rs implements it):
/// the handler reaches devices only through it, so that this module stays below them.
/// Every method must be async-signal-safe in the sense of this module's doc.
pub(crate) trait SignalledDevice: Send + Sync {
    /// Serves armed connection `fd` if it is this device's: whether it was.
    fn serve_signalled(&self, fd: i32) -> bool;
    /// The handler interrupted this library's own code: the engine's holder or the progress
    /// thread serves the armed connections instead.
    fn leave_to_others(&self);
    /// The same for the ACKs the device's timer was to write.
    fn leave_acks_to_others(&self);
    /// Writes what the device's connections hold (its ACK timer fired).
    fn write_held_acks(&self);
    /// Wakes the device's progress thread.
    fn wake(&self);
}

/// A registered device, boxed so that one atomic word names it (`register`).
struct Registered(*const dyn SignalledDevice);

/// Devices whose connections may be signalled: the handler looks for the descriptor in each.
const SLOTS: usize = 16;
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: AtomicPtr<Registered> = AtomicPtr::new(std::ptr::null_mut());
static DEVICES: [AtomicPtr<Registered>; SLOTS] = [EMPTY; SLOTS];
/// Each device's ACK timer, whose signal carries the slot (`register`): its timer_t plus
/// one (glibc's first timer is 0), 0 for none.
#[allow(clippy::declare_interior_mutable_const)]
const NO_TIMER: AtomicUsize = AtomicUsize::new(0);
static TIMERS: [AtomicUsize; SLOTS] = [NO_TIMER; SLOTS];
/// Handlers running now: a device leaving waits for them to finish with it.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// The signal, once installed (None: off, or it could not be installed).
static SIGNAL: OnceLock<Option<i32>> = OnceLock::new();
/// What handlers did, process-wide (relaxed counters: a handler may not take a lock); logged
/// at info level when a device closes (`DAT_LOG=daplrs_tcp=info`), read by tests: the
/// signals a round trip costs is the figure that tells a change of the service apart.
pub(crate) mod stats {
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Handlers entered.
    pub(crate) static SIGNALS: AtomicU64 = AtomicU64::new(0);
    /// Frames placed or completed by handlers.
    pub(crate) static FRAMES: AtomicU64 = AtomicU64::new(0);
    /// ACKs a handler sent itself (a send of its own: the peer's input, another signal).
    pub(crate) static ACKS_SENT: AtomicU64 = AtomicU64::new(0);
    /// ACKs a handler held to go out with our next frame (signalled.rs).
    pub(crate) static ACKS_HELD: AtomicU64 = AtomicU64::new(0);
    /// Signals of a device's ACK timer, and connections whose held ACKs they wrote.
    pub(crate) static ACK_TIMER_SIGNALS: AtomicU64 = AtomicU64::new(0);
    pub(crate) static ACK_TIMER_FLUSHES: AtomicU64 = AtomicU64::new(0);
    /// Writes of held ACKs with a frame of ours, and without.
    pub(crate) static HELD_WITH_FRAME: AtomicU64 = AtomicU64::new(0);
    pub(crate) static HELD_ALONE: AtomicU64 = AtomicU64::new(0);
    /// Handlers that served no frame, and those that served more than one.
    pub(crate) static IDLE: AtomicU64 = AtomicU64::new(0);
    pub(crate) static MULTI: AtomicU64 = AtomicU64::new(0);
    /// Handlers that found the engine held or interrupted our own code: left to others.
    pub(crate) static LEFT: AtomicU64 = AtomicU64::new(0);

    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn summary() -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "signals {} (no frame {}, several {}) frames {} acks sent {} held {} \
             timer signals {} timer flushes {} left {}; held ACKs written with a frame {}, \
             alone {}",
            g(&SIGNALS),
            g(&IDLE),
            g(&MULTI),
            g(&FRAMES),
            g(&ACKS_SENT),
            g(&ACKS_HELD),
            g(&ACK_TIMER_SIGNALS),
            g(&ACK_TIMER_FLUSHES),
            g(&LEFT),
            g(&HELD_WITH_FRAME),
            g(&HELD_ALONE)
        )
    }
}

/// This library's code, [start, end): a thread interrupted there may be halfway through
/// parking_lot's lock table (a lock's slow path), which our unlock could need.
static OUR_CODE: OnceLock<(usize, usize)> = OnceLock::new();

/// Which signal `DAPLRS_TARGET_SIGNAL` names: unset, empty, `off` or `0`: none; `on`: the
/// default real-time signal; a number between SIGRTMIN and SIGRTMAX; `rtmin+N`.
pub(crate) fn parse_signal(v: Option<&str>, rtmin: i32, rtmax: i32) -> Option<i32> {
    let v = v?.trim().to_ascii_lowercase();
    let n = match v.as_str() {
        "" | "off" | "0" | "no" => return None,
        "on" | "1" | "yes" => rtmin + 4,
        s => match s.strip_prefix("rtmin+") {
            Some(k) => rtmin + k.parse::<i32>().ok()?,
            None => s.parse().ok()?,
        },
    };
    if (rtmin..=rtmax).contains(&n) {
        Some(n)
    } else {
        log::warn!("DAPLRS_TARGET_SIGNAL={v}: not a real-time signal ({rtmin}..={rtmax}); off");
        None
    }
}

/// The signal in use, installing the handler at the first call; None: off.
pub(crate) fn signal() -> Option<i32> {
    *SIGNAL.get_or_init(|| {
        let v = std::env::var("DAPLRS_TARGET_SIGNAL").ok();
        let sig = parse_signal(v.as_deref(), libc::SIGRTMIN(), libc::SIGRTMAX())?;
        install(sig).then_some(sig)
    })
}

/// Installs the handler for `sig`, and for SIGIO (which the kernel sends instead when the
/// real-time signal queue is full: its default action would end the process), each only
/// where its disposition is still the default. False: `sig` is the application's.
fn install(sig: i32) -> bool {
    let ours = |s: i32| {
        // SAFETY: sigaction with a zeroed struct (SIG_DFL, no flags) to read the current one,
        // then with our handler; both structs are ours.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(s, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                return false;
            }
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaddset(&mut act.sa_mask, sig);
            libc::sigaddset(&mut act.sa_mask, libc::SIGIO);
            libc::sigaction(s, &act, std::ptr::null_mut()) == 0
        }
    };
    if !ours(sig) {
        log::warn!("DAPLRS_TARGET_SIGNAL: signal {sig} has a handler already; off");
        return false;
    }
    if !ours(libc::SIGIO) {
        log::info!("DAPLRS_TARGET_SIGNAL: SIGIO has a handler already; kept");
    }
    OUR_CODE.get_or_init(our_code);
    true
}

/// Blocks the signal on the calling thread (ours: the progress thread and helpers), so
/// that the kernel delivers it to an application thread.
pub(crate) fn block_here() {
    let Some(sig) = signal() else {
        return;
    };
    // SAFETY: a sigset of ours, initialised by sigemptyset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigaddset(&mut set, libc::SIGIO);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

// Linux's fcntl(2) values the libc crate does not carry.
const F_SETSIG: libc::c_int = 10;
const F_SETOWN_EX: libc::c_int = 15;
const F_OWNER_PID: libc::c_int = 1;
#[repr(C)]
struct FOwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}

/// Arms socket `fd` (an established connection's): its input raises the signal. Whether
/// it is armed.
pub(crate) fn arm(fd: i32) -> bool {
    let Some(sig) = signal() else {
        return false;
    };
    // SAFETY: fcntl on a descriptor the caller owns.
    let ok = set_owner_process(fd)
        && unsafe {
            libc::fcntl(fd, F_SETSIG, sig) == 0 && {
                let fl = libc::fcntl(fd, libc::F_GETFL);
                fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_ASYNC) == 0
            }
        };
    if !ok {
        log::debug!("DAPLRS_TARGET_SIGNAL: socket {fd} not armed");
    }
    ok
}

/// Turns the signal of armed socket `fd` off (while a thread of ours waits in poll on it)
/// or on again. A connection's socket is always non-blocking and has no other status flag
/// (engine/connection.rs), so one F_SETFL says it all (this runs twice a round for a
/// polling consumer).
pub(crate) fn set_async(fd: i32, on: bool) {
    let fl = libc::O_NONBLOCK | if on { libc::O_ASYNC } else { 0 };
    // SAFETY: fcntl on a descriptor the caller owns.
    unsafe { libc::fcntl(fd, libc::F_SETFL, fl) };
}

const F_OWNER_TID: libc::c_int = 0;

/// The calling thread's id, if it takes the signal (does not block it): the thread a
/// connection's signal should interrupt once it posts there. Cached per thread (a thread's
/// mask rarely changes; one that blocks the signal later only leaves it pending there
/// until the connection's next poster takes over).
pub(crate) fn poster() -> Option<i32> {
    thread_local! {
        static ME: std::cell::Cell<Option<Option<i32>>> = const { std::cell::Cell::new(None) };
        static EXIT: std::cell::RefCell<Option<PosterExit>> = const { std::cell::RefCell::new(None) };
    }
    let sig = signal()?;
    ME.with(|me| {
        if let Some(known) = me.get() {
            return known;
        }
        // SAFETY: reads the calling thread's mask into a sigset of ours.
        let takes = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set) == 0
                && libc::sigismember(&set, sig) == 0
        };
        // SAFETY: gettid has no preconditions.
        let mine = takes.then(|| unsafe { libc::gettid() });
        me.set(Some(mine));
        if mine.is_some() {
            let _ = EXIT.try_with(|e| *e.borrow_mut() = Some(PosterExit));
        }
        mine
    })
}

/// Poster threads that have exited, counted when their thread-locals go: a connection
/// whose signal went to one of them gets no signal at all (the kernel finds no thread), so
/// the progress thread then gives it back to the process (`Engine::forget_exited_posters`).
static POSTERS_EXITED: AtomicUsize = AtomicUsize::new(0);

struct PosterExit;

impl Drop for PosterExit {
    fn drop(&mut self) {
        POSTERS_EXITED.fetch_add(1, Ordering::SeqCst);
    }
}

/// How many poster threads have exited so far.
pub(crate) fn posters_exited() -> usize {
    POSTERS_EXITED.load(Ordering::SeqCst)
}

/// Whether thread `tid` of this process still runs.
pub(crate) fn thread_alive(tid: i32) -> bool {
    // SAFETY: signal 0 only checks that the thread exists; both ids are plain integers.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) == 0 }
}

/// Gives the signal of armed socket `fd` back to the process (F_OWNER_PID: the kernel picks
/// a thread that takes it).
pub(crate) fn set_owner_process(fd: i32) -> bool {
    set_owner(fd, F_OWNER_PID, std::process::id() as i32)
}

/// F_SETOWN_EX of socket `fd` to `id`, a process or a thread (`kind`). Whether it took.
fn set_owner(fd: i32, kind: libc::c_int, id: i32) -> bool {
    let owner = FOwnerEx { kind, pid: id };
    // SAFETY: fcntl on a descriptor the caller owns, with a struct of ours.
    unsafe { libc::fcntl(fd, F_SETOWN_EX, &owner) == 0 }
}

/// Directs the signal of armed socket `fd` to thread `tid` (F_OWNER_TID), rather than to
/// whichever thread of the process the kernel picks (the main thread first, even asleep in
/// `poll`, which it would wake with EINTR). Whether it took.
pub(crate) fn set_owner_thread(fd: i32, tid: i32) -> bool {
    set_owner(fd, F_OWNER_TID, tid)
}

/// Makes a device's connections reachable from the handler, with a timer of its own for
/// the ACKs handlers hold (engine/signalled.rs): its slot, None if off or no slot is free.
/// The device must stay alive until `unregister`.
pub(crate) fn register<D: SignalledDevice + 'static>(dev: &std::sync::Arc<D>) -> Option<usize> {
    let sig = signal()?;
    let dev: *const D = std::sync::Arc::as_ptr(dev);
    let dev = dev as *const dyn SignalledDevice;
    let p = Box::into_raw(Box::new(Registered(dev)));
    let Some(slot) = DEVICES.iter().position(|s| {
        s.compare_exchange(std::ptr::null_mut(), p, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }) else {
        // SAFETY: ours, from Box::into_raw above, published nowhere.
        drop(unsafe { Box::from_raw(p) });
        return None;
    };
    match ack_timer(sig, slot, None) {
        Some(t) => TIMERS[slot].store(t as usize + 1, Ordering::SeqCst),
        None => {
            log::debug!("DAPLRS_TARGET_SIGNAL: no ACK timer; ACKs wait for the progress thread")
        }
    }
    Some(slot)
}

/// A timer whose signal `sig` carries `slot`, sent to thread `tid` (SIGEV_THREAD_ID), or to
/// the process (None), which lets the kernel pick a thread: the main one first, even asleep
/// in a system call, which the signal then ends with EINTR.
fn ack_timer(sig: i32, slot: usize, tid: Option<i32>) -> Option<libc::timer_t> {
    // SAFETY: a zeroed sigevent with the fields SIGEV_SIGNAL / SIGEV_THREAD_ID read set; the
    // timer id is written by timer_create.
    unsafe {
        let mut ev: libc::sigevent = std::mem::zeroed();
        ev.sigev_notify = libc::SIGEV_SIGNAL;
        if let Some(tid) = tid {
            ev.sigev_notify = libc::SIGEV_THREAD_ID;
            ev.sigev_notify_thread_id = tid;
        }
        ev.sigev_signo = sig;
        ev.sigev_value.sival_ptr = slot as *mut libc::c_void;
        let mut t: libc::timer_t = std::ptr::null_mut();
        (libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut t) == 0).then_some(t)
    }
}

/// Sends device `slot`'s ACK timer signal to thread `tid` from now on (None: to the process),
/// as a connection's signal goes to the thread that posted on it: the one spinning for its
/// data, not whichever thread the kernel picks, which may sit in a system call of the
/// application's. A timer's target is fixed when it is made, so this makes a new one in
/// place of the old (a run of the old one carries over). Not async-signal-safe: the engine
/// holder calls it (handlers, which start the timer, then cannot hold the engine). Whether
/// it took.
pub(crate) fn direct_ack_timer(slot: usize, tid: Option<i32>) -> bool {
    let (Some(sig), Some(timers)) = (signal(), TIMERS.get(slot)) else {
        return false;
    };
    let Some(new) = ack_timer(sig, slot, tid) else {
        return false;
    };
    let old = timers
        .swap(new as usize + 1, Ordering::SeqCst)
        .checked_sub(1);
    if let Some(old) = old {
        let old = old as libc::timer_t;
        // SAFETY: timers of ours, out of the table (the old) or just made (the new); specs of
        // ours.
        unsafe {
            let mut left: libc::itimerspec = std::mem::zeroed();
            let read = libc::timer_gettime(old, &mut left) == 0;
            if read && (left.it_value.tv_sec, left.it_value.tv_nsec) != (0, 0) {
                libc::timer_settime(new, 0, &left, std::ptr::null_mut());
            }
            libc::timer_delete(old);
        }
    }
    // The device left meanwhile (`unregister` took the old timer or none): not ours to keep.
    if DEVICES[slot].load(Ordering::SeqCst).is_null() {
        if let Some(t) = timers.swap(0, Ordering::SeqCst).checked_sub(1) {
            // SAFETY: our timer, taken out of the table.
            unsafe { libc::timer_delete(t as libc::timer_t) };
        }
        return false;
    }
    true
}

/// Starts device `slot`'s ACK timer, one shot after `after`, or stops it (None). Whether it
/// runs. Async-signal-safe (timer_settime is): handlers start it.
pub(crate) fn set_ack_timer(slot: Option<usize>, after: Option<std::time::Duration>) -> bool {
    let Some(t) = slot
        .and_then(|s| TIMERS.get(s))
        .map(|t| t.load(Ordering::SeqCst))
        .and_then(|t| t.checked_sub(1))
    else {
        return false;
    };
    let d = after.unwrap_or_default();
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        },
    };
    // SAFETY: a timer of ours (deleted only in `unregister`, after its device left every
    // engine that names it), a spec of ours.
    let ok =
        unsafe { libc::timer_settime(t as libc::timer_t, 0, &spec, std::ptr::null_mut()) == 0 };
    ok && after.is_some()
}

/// The device leaves: once this returns, no handler uses it, and its timer is gone.
pub(crate) fn unregister<D: SignalledDevice + 'static>(dev: &D) {
    if signal().is_some() {
        log::info!("DAPLRS_TARGET_SIGNAL: {}", stats::summary());
    }
    let mut gone = Vec::new();
    for (slot, s) in DEVICES.iter().enumerate() {
        let p = s.load(Ordering::SeqCst);
        // SAFETY: a registered entry, freed only here, after it left its slot and no handler
        // runs (below); only this device's own unregister takes it out.
        let ours = unsafe { p.as_ref() }.is_some_and(|r| std::ptr::addr_eq(r.0, dev));
        if ours
            && s.compare_exchange(p, std::ptr::null_mut(), Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            gone.push(p);
            if let Some(t) = TIMERS[slot].swap(0, Ordering::SeqCst).checked_sub(1) {
                // SAFETY: our timer, taken out of the table: nobody starts it any more (the
                // engine's slot names no timer now).
                unsafe { libc::timer_delete(t as libc::timer_t) };
            }
        }
    }
    while ACTIVE.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
    for p in gone {
        // SAFETY: from Box::into_raw in `register`; out of its slot, and no handler that could
        // have loaded it still runs.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// Linux's si_code of a POSIX timer's signal.
const SI_TIMER: i32 = -2;

/// The part of a SIGIO/real-time siginfo_t the kernel fills for descriptor events
/// (`si_band`, `si_fd` after the three ints and the union's alignment).
#[repr(C)]
struct PollInfo {
    signo: i32,
    errno: i32,
    code: i32,
    band: libc::c_long,
    fd: i32,
}

/// The same for a POSIX timer's signal (`si_tid`, `si_overrun`, `si_value`).
#[repr(C)]
struct TimerInfo {
    signo: i32,
    errno: i32,
    code: i32,
    timer: TimerPart,
}
#[repr(C)]
struct TimerPart {
    tid: i32,
    overrun: i32,
    value: *mut libc::c_void,
}

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: errno is thread-local to the interrupted thread, which resumes after us.
    let saved = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a siginfo_t of at least this size to an SA_SIGINFO handler;
    // for a SIGIO or F_SETSIG signal it filled si_fd (another sender: any value, harmless:
    // the descriptor is only compared with our connections').
    let fd = unsafe { info.cast::<PollInfo>().as_ref() }.map_or(-1, |i| i.fd);
    // SAFETY: as above; for a timer's signal the union holds the timer's fields.
    let timer_slot = unsafe { info.cast::<TimerInfo>().as_ref() }
        .filter(|i| i.code == SI_TIMER)
        .map(|i| i.timer.value as usize);
    ACTIVE.fetch_add(1, Ordering::SeqCst);
    stats::add(&stats::SIGNALS, 1);
    #[cfg(test)]
    let _in = test_hooks::InHandler::enter();
    // No unwinding out of a signal handler (and nothing on this path panics: see the
    // module's documentation).
    let in_our_code = interrupted_in_our_code(ctx);
    let _ = std::panic::catch_unwind(|| match timer_slot {
        Some(slot) => serve_timer(slot, in_our_code),
        None => serve(sig, fd, in_our_code),
    });
    ACTIVE.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// Serves connection `fd` of whichever device has it. A plain SIGIO (the real-time queue
/// was full: no descriptor) wakes every progress thread instead.
fn serve(sig: i32, fd: i32, in_our_code: bool) {
    for slot in &DEVICES {
        let p = slot.load(Ordering::SeqCst);
        // SAFETY: a registered entry and its device stay alive until `unregister` saw ACTIVE
        // at zero, and we counted ourselves in ACTIVE before loading the pointer.
        let Some(sh) = (unsafe { p.as_ref().map(|r| &*r.0) }) else {
            continue;
        };
        if in_our_code {
            stats::add(&stats::LEFT, 1);
            sh.leave_to_others();
        } else if sig == libc::SIGIO {
            sh.wake();
        } else if sh.serve_signalled(fd) {
            return;
        }
    }
}

/// Device `slot`'s ACK timer fired: what its connections hold is written now.
fn serve_timer(slot: usize, in_our_code: bool) {
    stats::add(&stats::ACK_TIMER_SIGNALS, 1);
    #[cfg(test)]
    if test_hooks::elsewhere() {
        test_hooks::TIMER_ELSEWHERE.fetch_add(1, Ordering::Relaxed);
    }
    let Some(p) = DEVICES.get(slot).map(|s| s.load(Ordering::SeqCst)) else {
        return;
    };
    // SAFETY: as in `serve`.
    let Some(sh) = (unsafe { p.as_ref().map(|r| &*r.0) }) else {
        return;
    };
    if in_our_code {
        stats::add(&stats::LEFT, 1);
        sh.leave_acks_to_others();
    } else {
        sh.write_held_acks();
    }
}

/// Whether the thread this handler interrupted was running this library's code (or where
/// that cannot be told). Only then can it hold parking_lot's lock table, which an unlock of
/// ours that finds a waiter parked takes: the work is left to an ordinary thread.
fn interrupted_in_our_code(ctx: *mut libc::c_void) -> bool {
    let &(start, end) = OUR_CODE.get().unwrap_or(&(0, usize::MAX));
    let ctx = ctx.cast::<libc::ucontext_t>();
    // SAFETY: an SA_SIGINFO handler's third argument is the interrupted context.
    #[cfg(target_arch = "x86_64")]
    let pc = unsafe { ctx.as_ref() }.map(|c| c.uc_mcontext.gregs[libc::REG_RIP as usize] as usize);
    // SAFETY: as above.
    #[cfg(target_arch = "aarch64")]
    let pc = unsafe { ctx.as_ref() }.map(|c| c.uc_mcontext.pc as usize);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let pc: Option<usize> = {
        let _ = ctx;
        None
    };
    pc.is_none_or(|pc| (start..end).contains(&pc))
}

/// The executable segment of the object that holds this code (our provider library), found
/// once at installation (dl_iterate_phdr takes the loader's lock: never in the handler).
/// In this crate's own tests the object is the test program, spinner included: empty there.
fn our_code() -> (usize, usize) {
    if cfg!(test) {
        return (0, 0);
    }
    const PT_LOAD: u32 = 1;
    const PF_X: u32 = 1;
    struct Find {
        addr: usize,
        found: (usize, usize),
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our `Find`.
        let (info, find) = unsafe { (&*info, &mut *data.cast::<Find>()) };
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: dlpi_phdr has dlpi_phnum entries.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            let start = info.dlpi_addr as usize + ph.p_vaddr as usize;
            let end = start + ph.p_memsz as usize;
            if ph.p_type == PT_LOAD && ph.p_flags & PF_X != 0 && (start..end).contains(&find.addr) {
                find.found = (start, end);
                return 1;
            }
        }
        0
    }
    let mut find = Find {
        addr: on_signal as *const () as usize,
        found: (0, usize::MAX),
    };
    // SAFETY: `each` only reads the headers it is given and writes our `find`.
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut find).cast()) };
    find.found
}

/// What the tests (tests/sigio.rs) see of the handler: whether the current thread runs it
/// (their allocator counts what it allocates there), how often it ran and served, a
/// switch that makes it find every engine busy, and how long ACKs are held.
#[cfg(test)]
pub(crate) mod test_hooks {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

    thread_local! {
        pub(crate) static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
    }
    pub(crate) static HANDLED: AtomicU64 = AtomicU64::new(0);
    pub(crate) static SERVED: AtomicU64 = AtomicU64::new(0);
    /// Threads of the test that post (0: none), and the frames handlers served on other
    /// threads while one is set.
    #[allow(clippy::declare_interior_mutable_const)]
    const NONE: AtomicI32 = AtomicI32::new(0);
    pub(crate) static POSTERS: [AtomicI32; 2] = [NONE; 2];
    pub(crate) static SERVED_ELSEWHERE: AtomicU64 = AtomicU64::new(0);
    /// ACK timer signals taken on other threads than `POSTERS` while one is set.
    pub(crate) static TIMER_ELSEWHERE: AtomicU64 = AtomicU64::new(0);

    /// Whether this thread is not one of `POSTERS`, while one is set.
    pub(crate) fn elsewhere() -> bool {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let posters = POSTERS.each_ref().map(|p| p.load(Ordering::Relaxed));
        posters[0] != 0 && !posters.contains(&me)
    }
    pub(crate) static FORCE_BUSY: AtomicBool = AtomicBool::new(false);
    /// How long handlers hold ACKs, in microseconds, instead of `ACK_HOLD` (0: that).
    pub(crate) static HOLD_US: AtomicU64 = AtomicU64::new(0);

    pub(crate) struct InHandler;

    impl InHandler {
        pub(crate) fn enter() -> InHandler {
            IN_HANDLER.with(|f| f.set(true));
            HANDLED.fetch_add(1, Ordering::Relaxed);
            InHandler
        }
    }

    impl Drop for InHandler {
        fn drop(&mut self) {
            IN_HANDLER.with(|f| f.set(false));
        }
    }
}
