//! The engine's part of signal-driven target service (../sigio.rs): small RDMA writes,
//! sends and RDMA reads from the peer served by a signal handler on whatever application
//! thread the kernel interrupted. Nothing here may allocate, free or block (the interrupted
//! thread may hold the allocator's lock), so a frame is served only when everything it
//! needs is at hand:
//!
//! 1. the connection is established and idle (nothing buffered in its decoder, nothing held,
//!    queued or streamed, no same-host ring, no waiting thread driving it);
//! 2. the whole frame is in the socket: peeked into a stack buffer, not yet consumed;
//! 3. its data placed (the key table and, for a send, the CQ's queue taken with `try_lock`;
//!    the completion fits the queue's capacity);
//! 4. only then is it answered: the ACK held in room reserved beforehand
//!    (`OutQueue::hold_ack`), to go out ahead of our next frame on the connection (an RDMA
//!    read's answer, up to 4 KiB, is held there too and written at once); the frames one
//!    peek showed and the handler served are taken off the socket with one recv.
//!
//! Why held: sent at once, the ACK is input of its own for the peer, whose spinning thread
//! then takes a second signal (one per frame on loopback, where our send runs the peer's
//! receive path); a spinning target answers a ping within microseconds, and that answer
//! carries the ACK in the same segment, served by the peer's one signal. The bound: a
//! per-device timer (`sigio::set_ack_timer`, `ACK_HOLD`) whose signal writes what is still
//! held, so a lone write's initiator waiting on its EVD completes `ACK_HOLD` later at most
//! (plus a signal); any thread of ours that writes the connection first sends them too.
//!
//! Anything else stops the handler before step 4, with the frame still in the socket for
//! the progress thread (or the thread driving the connection), which its arrival woke.

use super::*;
use crate::sigio::stats;

/// Largest payload served from a signal handler (its stack buffer holds the frame).
pub(crate) const SIGNALLED_MAX: usize = 4096;
/// Frames served per signal at most (the rest wake the progress thread as usual).
const FRAMES_PER_SIGNAL: usize = 16;
/// Completions and spent receives a handler may leave for the next engine holder.
pub(super) const SIGNALLED_SLOTS: usize = 64;
/// How long a handler's ACK may wait for our next frame before the timer's signal sends it:
/// above a spinning target's turnaround (it sees its memory change and posts its answer in
/// a few microseconds; a busy-polled TCP round trip on loopback or veth is 15-25), so a
/// ping-pong's answer takes the ACK first; short enough that an initiator whose target
/// never answers still completes within about the signal service's own one-way time.
pub(crate) const ACK_HOLD: std::time::Duration = std::time::Duration::from_micros(50);

impl Engine {
    /// Serves what the peer sent on the connection whose socket is `fd`, if it is ours:
    /// Some(frames served), None if no connection of this engine has that socket. What it
    /// leaves in the socket is left to the progress thread (`signal_sweep`).
    pub(crate) fn serve_signalled(&mut self, sh: &Shared, fd: i32) -> Option<usize> {
        let token = self
            .conns
            .iter()
            .find(|(_, c)| c.stream.as_raw_fd() == fd)
            .map(|(t, _)| *t)?;
        let mut buf = [0u8; wire::HEADER_LEN + SIGNALLED_MAX];
        let mut served = 0;
        let left = loop {
            let (n, stop) = self.serve_peeked(sh, token, fd, &mut buf, FRAMES_PER_SIGNAL - served);
            served += n;
            match stop {
                // The peek filled the buffer: more may be in the socket.
                Signalled::Served if served < FRAMES_PER_SIGNAL => {}
                Signalled::Served => break true,
                Signalled::Nothing => break false,
                Signalled::Left => break true,
            }
        };
        self.signal_sweep |= left;
        // Completions to notify wait for the application's next DAT call, which takes them
        // (`take_signalled`), or the timer: waking the progress thread for each costs the
        // spinning application a CPU (a thread waiting in `dat_evd_wait` reads its
        // connections itself: a handler serves none of them).
        if self.signalled_pending() && !self.arm_ack_timer() {
            self.wake_needed = true;
        }
        self.signalled_frames += served as u64;
        stats::add(&stats::FRAMES, served as u64);
        match served {
            0 => stats::add(&stats::IDLE, 1),
            1 => {}
            _ => stats::add(&stats::MULTI, 1),
        }
        Some(served)
    }

    /// Up to `max` frames (steps 1-4 above) of what one peek at socket `fd` shows, then
    /// taken off the socket with one recv: how many, and why it stopped (Served: the peek
    /// filled the buffer, or `max`; Nothing: everything peeked was served, or the rest of
    /// a frame is still to come, which raises the signal again).
    fn serve_peeked(
        &mut self,
        sh: &Shared,
        token: u64,
        fd: i32,
        buf: &mut [u8],
        max: usize,
    ) -> (usize, Signalled) {
        if let Err(stop) = self.signalled_qp(token) {
            return (0, stop);
        }
        let n = match peek(fd, buf) {
            Some(0) => return (0, Signalled::Left), // its end: the progress thread sees it
            Some(n) => n,
            None => return (0, Signalled::Nothing),
        };
        let (mut off, mut served) = (0, 0);
        let stop = loop {
            if served == max {
                break Signalled::Served;
            }
            let (h, len) = match frame_at(&buf[off..n], &sh.limits) {
                Peeked::Frame(h, len) => (h, len),
                Peeked::Partial if off > 0 && n == buf.len() => break Signalled::Served,
                Peeked::Partial => break Signalled::Nothing,
                Peeked::Other => break Signalled::Left,
            };
            let qp = match self.signalled_qp(token) {
                Ok(qp) => qp,
                Err(stop) => break stop,
            };
            let p = &buf[off + wire::HEADER_LEN..off + wire::HEADER_LEN + len];
            let placed = match h.kind {
                Kind::Write if h.flags == 0 => self.signalled_write(sh, qp, &h, p),
                Kind::Send if h.flags == 0 => self.signalled_send(sh, qp, p),
                // The answer to our write or send, ahead of the peer's next request.
                Kind::Ack if len == 0 => self.signalled_ack(qp, &h),
                Kind::ReadReq if len == 0 && h.flags == 0 => self.signalled_read(sh, token, qp, &h),
                _ => false,
            };
            if !placed {
                break Signalled::Left;
            }
            off += wire::HEADER_LEN + len;
            served += 1;
            self.frames_served += 1;
            if matches!(h.kind, Kind::Write | Kind::ReadReq) {
                self.requests_served += 1;
            }
            // A read was answered with its data (`signalled_read`).
            if matches!(h.kind, Kind::Write | Kind::Send) {
                self.ack(token, &h);
            }
        };
        if off > 0 {
            consume(fd, off, buf);
        }
        (served, stop)
    }

    /// The QP of connection `token` if a handler may serve it now (steps 1 and 3's room),
    /// or why not: Nothing (a waiting thread drives it, woken by the same input), Left.
    fn signalled_qp(&mut self, token: u64) -> Result<u32, Signalled> {
        if self.conns.get(&token).is_none_or(|c| c.driven.is_some()) {
            return Err(Signalled::Nothing);
        }
        let room = self.room_for_ack(token);
        let Some(c) = self.conns.get(&token) else {
            return Err(Signalled::Nothing);
        };
        let Phase::Established { qp } = c.phase else {
            return Err(Signalled::Left);
        };
        let idle = c.dec.is_idle()
            && c.held.is_empty()
            && c.sink.is_none()
            && room
            && !c.write_failed
            && !c.draining
            && !c.close_when_flushed
            && c.peer_end.is_none()
            && c.same_host.incoming.is_none()
            && c.same_host.outgoing.is_none();
        if !idle || self.signalled_cqs.len() >= SIGNALLED_SLOTS {
            return Err(Signalled::Left);
        }
        Ok(qp)
    }

    /// A WRITE's data placed (nothing else changes: it is answered in `consume_and_ack`).
    fn signalled_write(&mut self, sh: &Shared, qp: u32, h: &Header, p: &[u8]) -> bool {
        let Some(e) = self.qps.get(&qp) else {
            return false;
        };
        let Some(keys) = sh.keys.try_read() else {
            return false;
        };
        // A refused write is left to the progress thread, which refuses it as usual.
        keys.remote_write(h.key, h.addr, e.pd, p).is_ok()
    }

    /// An RDMA read of our memory answered now (a NIC needs no CPU of the target's for it
    /// either): its READ_RESP, the data copied from the registration, goes behind the ACKs
    /// held before it (the peer matches answers to requests in order) and they are all
    /// written at once; what the socket does not take stays held for the progress thread,
    /// woken. A refused read (key, range, right, memory gone) is left to the progress
    /// thread, which refuses it as usual.
    fn signalled_read(&mut self, sh: &Shared, token: u64, qp: u32, h: &Header) -> bool {
        let len = h.length as usize;
        let Some(pd) = self.qps.get(&qp).map(|e| e.pd) else {
            return false;
        };
        if len > wire::HELD_ANSWER_MAX {
            return false;
        }
        let Some(keys) = sh.keys.try_read() else {
            return false;
        };
        let Some(c) = self.conns.get_mut(&token) else {
            return false;
        };
        let mut resp = Header::new(Kind::ReadResp);
        resp.seq = h.seq;
        resp.payload_len = h.length;
        let held = c.out.hold_answer(&resp.encode(), len, |out| {
            keys.remote_read_into(h.key, h.addr, pd, out).is_ok()
        });
        drop(keys);
        if held {
            self.write_held_now(token);
        }
        held
    }

    /// A SEND placed into the QP's next posted receive (its own queue, no same-host window)
    /// and its completion queued; the spent receive is parked, not freed (`take_signalled`).
    fn signalled_send(&mut self, sh: &Shared, qp: u32, p: &[u8]) -> bool {
        let Some(e) = self.qps.get_mut(&qp) else {
            return false;
        };
        if e.srq.is_some() || e.recv_window.is_some() {
            return false;
        }
        let Some(wr) = e.rq.front() else {
            return false;
        };
        if self.signalled_rqs.len() >= SIGNALLED_SLOTS {
            return false;
        }
        let Some(mut queue) = e.recv_cq.try_queue() else {
            return false;
        };
        if queue.len() >= queue.capacity() {
            return false;
        }
        let Some(keys) = sh.keys.try_read() else {
            return false;
        };
        // A receive too small (or memory gone) is left to the progress thread, which fails it.
        if keys.scatter(&wr.sgl, e.pd, p).is_err() {
            return false;
        }
        drop(keys);
        let Some(wr) = e.rq.pop_front() else {
            return false;
        };
        queue.push_back(wr.completion(WcStatus::Success, WcOpcode::Recv, p.len() as u32, qp));
        drop(queue);
        e.recvs_done += 1;
        self.signalled_cqs.push(e.recv_cq.clone());
        self.signalled_rqs.push(wr);
        true
    }

    /// A successful ACK of our oldest request, a write or a send with nothing behind it that
    /// completes with it (a local operation) or waits for it: that request completes.
    fn signalled_ack(&mut self, qp: u32, h: &Header) -> bool {
        let Some(e) = self.qps.get_mut(&qp) else {
            return false;
        };
        let plain = |o: &Outstanding| {
            o.local.is_none()
                && o.read_sgl.capacity() == 0 // dropped without a free
                && matches!(o.opcode, WcOpcode::Send | WcOpcode::RdmaWrite)
        };
        let ours = e
            .outstanding
            .front()
            .is_some_and(|o| plain(o) && o.seq == h.seq);
        let next_local = e.outstanding.get(1).is_some_and(|o| o.local.is_some());
        if !ours || next_local || h.status != Status::Ok || e.graceful_pending {
            return false;
        }
        if self.signalled_cqs.len() >= SIGNALLED_SLOTS {
            return false;
        }
        let Some(mut queue) = e.send_cq.try_queue() else {
            return false;
        };
        if queue.len() >= queue.capacity() {
            return false;
        }
        let Some(o) = e.outstanding.pop_front() else {
            return false;
        };
        queue.push_back(
            WorkCompletion::new(o.wr_id, WcStatus::Success, o.opcode, o.len, qp).with_ctx(o.ctx),
        );
        drop(queue);
        self.signalled_cqs.push(e.send_cq.clone());
        true
    }

    /// Whether connection `token` can hold one more ACK, writing those it holds first if
    /// it is full (nothing else queued: a handler serves an idle connection only).
    fn room_for_ack(&mut self, token: u64) -> bool {
        let Some(c) = self.conns.get_mut(&token) else {
            return false;
        };
        if c.out.holds_acks() && !c.out.can_hold_ack() {
            let fd = c.stream.as_raw_fd();
            c.out.write_held(|s| sys::send_nosignal(fd, s));
        }
        c.out.can_hold_ack()
    }

    /// Answers the peer's request `h` (consumed from its connection): the ACK held for our
    /// next frame, with the device's timer as the bound (module documentation).
    fn ack(&mut self, token: u64, h: &Header) {
        let mut ack = Header::new(Kind::Ack);
        ack.seq = h.seq;
        self.hold_ack(token, &ack, false);
    }

    /// Holds ACK `ack` on signalled connection `token` for our next frame there (false: it
    /// cannot, send it as any answer), starting the device's ACK timer; `note` counts it
    /// as an answer pending (budget.rs: not in a handler, which may not allocate). Without
    /// a timer it is written at once.
    pub(super) fn hold_ack(&mut self, token: u64, ack: &Header, note: bool) -> bool {
        let Some(c) = self.conns.get_mut(&token) else {
            return false;
        };
        // Not on a same-host connection: past its SWITCH its frames go through a ring,
        // which the timer's flush (straight into the socket) does not write.
        let plain = c.same_host.outgoing.is_none()
            && c.same_host.incoming.is_none()
            && c.same_host.switch_at.is_none();
        if !c.signalled || !plain || !c.out.can_hold_ack() {
            return false;
        }
        c.out.hold_ack(&ack.encode());
        c.acks_wait = true;
        if note {
            c.note_answer(wire::HEADER_LEN);
        }
        stats::add(&stats::ACKS_HELD, 1);
        if !self.arm_ack_timer() {
            self.write_held_now(token);
        }
        true
    }

    /// Writes what connection `token` holds now, allocating nothing; the progress thread,
    /// woken, writes what the socket does not take.
    fn write_held_now(&mut self, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        c.acks_wait = false;
        let fd = c.stream.as_raw_fd();
        c.out.write_held(|s| sys::send_nosignal(fd, s));
        if c.out.holds_acks() {
            self.wake_needed = true;
            self.signal_sweep = true;
        }
    }

    /// A thread of the application posts on `qp`: it is the one likely to spin for the
    /// answer, so the connection's signal goes to it from now on (sigio.rs
    /// `set_owner_thread`). One `fcntl` when the poster changes, none otherwise. A poster
    /// that has exited takes no signal: the connection's frames then wait for the progress
    /// thread, as without the signal, until another thread posts there.
    pub(crate) fn note_poster(&mut self, qp: u32) {
        let Some(token) = self.qps.get(&qp).and_then(|e| e.conn) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&token).filter(|c| c.signalled) else {
            return;
        };
        let Some(tid) = crate::sigio::poster() else {
            return;
        };
        if c.signal_owner != Some(tid) && crate::sigio::set_owner_thread(c.stream.as_raw_fd(), tid)
        {
            c.signal_owner = Some(tid);
            self.direct_ack_timer(Some(tid));
        }
    }

    /// Sends the ACK timer's signal to thread `tid` (None: the process) if it goes elsewhere.
    fn direct_ack_timer(&mut self, tid: Option<i32>) {
        let Some(slot) = self.signal_slot else {
            return;
        };
        if self.ack_timer_thread != tid && crate::sigio::direct_ack_timer(slot, tid) {
            self.ack_timer_thread = tid;
        }
    }

    /// After a poster thread exited (sigio.rs `posters_exited`), the connections whose
    /// signal went to a thread that is gone get it back to the process. Checked at each
    /// turn of the progress thread (its tick at the latest); nothing to do, one atomic load.
    pub(crate) fn forget_exited_posters(&mut self) {
        let exited = crate::sigio::posters_exited();
        if exited == self.posters_exited_seen {
            return;
        }
        self.posters_exited_seen = exited;
        for c in self.conns.values_mut() {
            let Some(tid) = c.signal_owner else {
                continue;
            };
            if !crate::sigio::thread_alive(tid)
                && crate::sigio::set_owner_process(c.stream.as_raw_fd())
            {
                c.signal_owner = None;
            }
        }
        if self
            .ack_timer_thread
            .is_some_and(|tid| !crate::sigio::thread_alive(tid))
        {
            self.direct_ack_timer(None);
        }
    }

    /// Starts the device's ACK timer unless it runs: whether it runs.
    fn arm_ack_timer(&mut self) -> bool {
        if !self.ack_timer_armed {
            let hold = ack_hold();
            self.ack_timer_armed = crate::sigio::set_ack_timer(self.signal_slot, Some(hold));
            // clock_gettime is async-signal-safe (the vDSO's, or the system call).
            self.ack_timer_due = Some(std::time::Instant::now() + hold);
        }
        self.ack_timer_armed
    }

    /// Whether the ACK timer should have fired a tick ago: its signal found no thread to
    /// take it (every application thread blocks it, or none runs), and the progress
    /// thread's tick writes the held ACKs instead.
    pub(crate) fn ack_timer_overdue(&self, tick: std::time::Duration) -> bool {
        self.ack_timer_armed
            && self
                .ack_timer_due
                .is_some_and(|due| std::time::Instant::now() > due + tick)
    }

    /// The device's ACK timer fired (in a signal handler): writes what connections still
    /// hold, allocating nothing; what a socket refuses is the progress thread's.
    pub(crate) fn write_held_acks(&mut self) {
        self.ack_timer_armed = false;
        for c in self.conns.values_mut() {
            c.acks_wait = false;
            if c.out.holds_acks() {
                let fd = c.stream.as_raw_fd();
                c.out.write_held(|s| sys::send_nosignal(fd, s));
                stats::add(&stats::ACK_TIMER_FLUSHES, 1);
            }
            if c.out.holds_acks() {
                self.wake_needed = true;
            }
        }
        if self.signalled_pending() {
            self.wake_needed = true; // the progress thread notifies
        }
    }

    /// After an ordinary write or a take of what handlers left: once no connection holds an
    /// ACK and no completion waits to be notified, the timer is stopped (its signal would
    /// only interrupt the application for nothing).
    pub(crate) fn stop_ack_timer_if_sent(&mut self) {
        if self.ack_timer_armed
            && !self.signalled_pending()
            && !self.conns.values().any(|c| c.out.holds_acks())
        {
            crate::sigio::set_ack_timer(self.signal_slot, None);
            self.ack_timer_armed = false;
        }
    }

    /// What handlers left for an ordinary holder of the engine: their CQs to notify, and the
    /// receives they spent, freed here.
    pub(crate) fn take_signalled(&mut self, deferred: &mut Vec<Deferred>) {
        for cq in self.signalled_cqs.drain(..) {
            deferred.push(Deferred::Notify(cq));
        }
        self.signalled_rqs.clear();
        self.stop_ack_timer_if_sent();
    }

    /// Reads the connections armed for the target signal that no thread drives: what
    /// handlers left (the progress thread, after a handler or a driver asked for it); with
    /// `acks_due` (the ACK timer found the engine held, or is overdue), the ACKs they hold
    /// are written too.
    pub(crate) fn sweep_signalled(&mut self, sh: &Shared, buf: &mut [u8], acks_due: bool) {
        self.signal_sweep = false;
        let tokens = self
            .conns
            .iter()
            .filter(|(_, c)| c.signalled && c.driven.is_none())
            .map(|(t, _)| *t)
            .collect::<Vec<_>>();
        for t in tokens {
            self.read_conn(sh, t, buf);
        }
        if acks_due {
            self.ack_timer_armed = false; // it fired (or, at a tick, is stopped here)
            crate::sigio::set_ack_timer(self.signal_slot, None);
            let holding = self
                .conns
                .iter_mut()
                .filter(|(_, c)| c.out.holds_acks())
                .map(|(t, c)| {
                    c.acks_wait = false;
                    *t
                })
                .collect::<Vec<_>>();
            for t in holding {
                self.try_write(t);
            }
        }
    }

    /// Whether handlers left completions to notify.
    pub(crate) fn signalled_pending(&self) -> bool {
        !self.signalled_cqs.is_empty()
    }

    /// Reserves what a handler may use (on an ordinary thread, which may allocate).
    pub(crate) fn reserve_signalled(&mut self) {
        self.signalled_cqs.reserve(SIGNALLED_SLOTS);
        self.signalled_rqs.reserve(SIGNALLED_SLOTS);
    }
}

/// `ACK_HOLD`, or what a test asks for.
fn ack_hold() -> std::time::Duration {
    #[cfg(test)]
    {
        let us = crate::sigio::test_hooks::HOLD_US.load(std::sync::atomic::Ordering::Relaxed);
        if us != 0 {
            return std::time::Duration::from_micros(us);
        }
    }
    ACK_HOLD
}

/// Takes the frame of `total` bytes peeked before off socket `fd`. Under the engine lock
/// nobody else reads the socket: the peeked bytes are still there, whole.
fn consume(fd: i32, total: usize, sink: &mut [u8]) {
    // SAFETY: recv into a buffer of ours, at most its length.
    let _ = unsafe {
        libc::recv(
            fd,
            sink.as_mut_ptr().cast(),
            total.min(sink.len()),
            libc::MSG_DONTWAIT,
        )
    };
}

/// Why a handler stopped serving a connection.
enum Signalled {
    /// More may be there to peek.
    Served,
    /// Nothing to read now, or the rest of a frame still to come (which signals again), or
    /// a connection a waiting thread drives.
    Nothing,
    /// Something the handler does not serve: the progress thread's.
    Left,
}

/// What is at the head of peeked bytes.
enum Peeked {
    /// A whole frame small enough for a handler: its header and payload length.
    Frame(Header, usize),
    /// Nothing, or part of a small frame.
    Partial,
    /// A frame too large for a handler, or one that does not decode.
    Other,
}

/// What socket `fd` holds, peeked (not consumed) into `buf`: its length (0: the peer's
/// end), None if nothing (or an error, which the progress thread sees when it reads).
fn peek(fd: i32, buf: &mut [u8]) -> Option<usize> {
    // SAFETY: recv into a buffer of ours, at most its length.
    let n = unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).ok()
}

/// The frame at the head of `bytes` (peeked).
fn frame_at(bytes: &[u8], limits: &wire::Limits) -> Peeked {
    let Some(head) = bytes
        .get(..wire::HEADER_LEN)
        .and_then(|b| <&[u8; wire::HEADER_LEN]>::try_from(b).ok())
    else {
        return Peeked::Partial;
    };
    let Ok(h) = Header::decode(head, limits) else {
        return Peeked::Other;
    };
    let len = h.payload_len as usize;
    match len <= SIGNALLED_MAX {
        true if bytes.len() >= wire::HEADER_LEN + len => Peeked::Frame(h, len),
        true => Peeked::Partial,
        false => Peeked::Other,
    }
}
