//! The engine's part of signal-driven target service (../sigio.rs): small RDMA writes and
//! sends from the peer placed by a signal handler on whatever application thread the kernel
//! interrupted. Nothing here may allocate, free or block (the interrupted thread may hold
//! the allocator's lock), so a frame is served only when everything it needs is at hand:
//!
//! 1. the connection is established and idle (nothing buffered in its decoder, nothing held,
//!    queued or streamed, no same-host ring, no waiting thread driving it);
//! 2. the whole frame is in the socket: peeked into a stack buffer, not yet consumed;
//! 3. its data placed (the key table and, for a send, the CQ's queue taken with `try_lock`;
//!    the completion fits the queue's capacity);
//! 4. only then is it consumed from the socket and answered (the ACK sent straight, or, if
//!    the socket does not take it whole, queued in capacity reserved beforehand).
//!
//! Anything else stops the handler before step 4, with the frame still in the socket for
//! the progress thread (or the thread driving the connection), which its arrival woke.

use super::*;

/// Largest payload served from a signal handler (its stack buffer holds the frame).
pub(crate) const SIGNALLED_MAX: usize = 4096;
/// Frames served per signal at most (the rest wake the progress thread as usual).
const FRAMES_PER_SIGNAL: usize = 16;
/// Completions and spent receives a handler may leave for the next engine holder.
pub(super) const SIGNALLED_SLOTS: usize = 64;

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
            match self.serve_one_signalled(sh, token, fd, &mut buf) {
                Signalled::Served if served + 1 < FRAMES_PER_SIGNAL => served += 1,
                Signalled::Served => break true,
                Signalled::Nothing => break false,
                Signalled::Left => break true,
            }
        };
        self.signal_sweep |= left;
        self.signalled_frames += served as u64;
        Some(served)
    }

    /// One frame (steps 1-4 above).
    fn serve_one_signalled(
        &mut self,
        sh: &Shared,
        token: u64,
        fd: i32,
        buf: &mut [u8],
    ) -> Signalled {
        let Some(c) = self.conns.get(&token) else {
            return Signalled::Nothing;
        };
        if c.driven.is_some() {
            return Signalled::Nothing; // its driver reads it, woken by the same input
        }
        let Phase::Established { qp } = c.phase else {
            return Signalled::Left;
        };
        let idle = c.dec.is_idle()
            && c.held.is_empty()
            && c.sink.is_none()
            && c.out.is_empty()
            && c.out.has_spare()
            && !c.write_failed
            && !c.draining
            && !c.close_when_flushed
            && c.peer_end.is_none()
            && c.same_host.incoming.is_none()
            && c.same_host.outgoing.is_none();
        if !idle || self.signalled_cqs.len() >= SIGNALLED_SLOTS {
            return Signalled::Left;
        }
        let (h, len) = match peek_frame(fd, buf, &sh.limits) {
            Peeked::Frame(h, len) => (h, len),
            Peeked::Partial => return Signalled::Nothing, // its rest raises the signal again
            Peeked::Other => return Signalled::Left,
        };
        let p = &buf[wire::HEADER_LEN..wire::HEADER_LEN + len];
        let placed = match h.kind {
            Kind::Write if h.flags == 0 => self.signalled_write(sh, qp, &h, p),
            Kind::Send if h.flags == 0 => self.signalled_send(sh, qp, p),
            // The answer to our write or send, ahead of the peer's next request.
            Kind::Ack if len == 0 => self.signalled_ack(qp, &h),
            _ => false,
        };
        if !placed {
            return Signalled::Left;
        }
        self.frames_served += 1;
        if h.kind == Kind::Write {
            self.requests_served += 1;
        }
        consume(fd, wire::HEADER_LEN + len, buf);
        if h.kind != Kind::Ack {
            self.ack(token, fd, &h);
        }
        Signalled::Served
    }

    /// A WRITE's data placed (nothing else changes: it is answered in `consume_and_ack`).
    fn signalled_write(&mut self, sh: &Shared, qp: u32, h: &Header, p: &[u8]) -> bool {
        let Some(e) = self.qps.get(&qp) else {
            return false;
        };
        let Some(keys) = sh.keys.try_lock() else {
            return false;
        };
        // A refused write is left to the progress thread, which refuses it as usual.
        keys.remote_write(h.key, h.addr, e.pd, p).is_ok()
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
        let Some(keys) = sh.keys.try_lock() else {
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
        queue.push_back(WorkCompletion::new(
            wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            p.len() as u32,
            qp,
        ));
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
        queue.push_back(WorkCompletion::new(
            o.wr_id,
            WcStatus::Success,
            o.opcode,
            o.len,
            qp,
        ));
        drop(queue);
        self.signalled_cqs.push(e.send_cq.clone());
        true
    }

    /// Answers the peer's request `h` (consumed from socket `fd`).
    fn ack(&mut self, token: u64, fd: i32, h: &Header) {
        let mut ack = Header::new(Kind::Ack);
        ack.seq = h.seq;
        let bytes = ack.encode();
        let sent = sys::send_nosignal(fd, &[std::io::IoSlice::new(&bytes)]).unwrap_or(0);
        if sent < bytes.len() {
            if let Some(c) = self.conns.get_mut(&token) {
                c.out.push_spare(&bytes[sent..]);
            }
            self.wake_needed = true; // the progress thread writes the rest
        }
    }

    /// What handlers left for an ordinary holder of the engine: their CQs to notify, and the
    /// receives they spent, freed here.
    pub(crate) fn take_signalled(&mut self, deferred: &mut Vec<Deferred>) {
        for cq in self.signalled_cqs.drain(..) {
            deferred.push(Deferred::Notify(cq));
        }
        self.signalled_rqs.clear();
    }

    /// Reads the connections armed for the target signal that no thread drives: what
    /// handlers left (the progress thread, after a handler or a driver asked for it).
    pub(crate) fn sweep_signalled(&mut self, sh: &Shared, buf: &mut [u8]) {
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

/// What one frame came to in a handler.
enum Signalled {
    Served,
    /// Nothing to read now, or the rest of a frame still to come (which signals again), or
    /// a connection a waiting thread drives.
    Nothing,
    /// Something the handler does not serve: the progress thread's.
    Left,
}

/// What is at the head of a socket.
enum Peeked {
    /// A whole frame small enough for a handler: its header and payload length.
    Frame(Header, usize),
    /// Nothing, or part of a small frame.
    Partial,
    /// A frame too large for a handler, or one that does not decode.
    Other,
}

/// What is at the head of socket `fd`, peeked (not consumed) into `buf`.
fn peek_frame(fd: i32, buf: &mut [u8], limits: &wire::Limits) -> Peeked {
    // SAFETY: recv into a buffer of ours, at most its length.
    let n = unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    // An error (EAGAIN) or the end of stream: the progress thread sees an end when it reads.
    let n = match usize::try_from(n) {
        Ok(0) => return Peeked::Other,
        Ok(n) => n,
        Err(_) => return Peeked::Partial,
    };
    let Some(head) = buf
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
        true if n >= wire::HEADER_LEN + len => Peeked::Frame(h, len),
        true => Peeked::Partial,
        false => Peeked::Other,
    }
}
