//! The engine's side of the same-host path (../samehost/): the handshake that sets it up on a
//! connection, RDMA reads and writes done on the posting thread when it is set up, and the
//! switch of each direction's frames (sends, atomics, write-with-immediate, answers, connection
//! management) from the socket to the receiver's ring (../samehost/ring.rs).

use super::super::samehost::{self as shm, ring::Ring, Mode, TableLock, LOG};
use super::*;

/// A QP's posted receives as published in its connection's same-host ring (ring.rs, "the
/// receive window"), for the peer to place its sends in.
pub(crate) struct RecvWindow {
    ring: Arc<Ring>,
    /// Our table's mutex, which the peer holds across each placement.
    lock: TableLock,
    /// Receives 0 to `published` - 1 of the connection are published.
    published: u64,
}

impl RecvWindow {
    /// Withdraws the receives published and not consumed (`done` on), under our table's
    /// mutex: once this returns no peer places a message in them, so they may be flushed.
    /// Returns what the peer placed in those it took first, in order (their PLACED frames
    /// not read yet): those receives complete, as the peer's sends did.
    pub(super) fn withdraw(&self, done: u64) -> Vec<shm::ring::Placement> {
        self.lock.locked(|| {
            let mut placed = Vec::new();
            let mut j = done;
            while let Some(p) = (j < self.published)
                .then(|| self.ring.placement(j))
                .flatten()
            {
                placed.push(p);
                j += 1;
            }
            for j in j..self.published {
                self.ring.withdraw_recv(j);
            }
            placed
        })
    }
}

impl Engine {
    /// Whether a connection uses the path, given whether its peer advertised it: Err (with
    /// why) when it does not and DAPLRS_SAME_HOST=require says it must.
    fn same_host_decide(sh: &Shared, token: u64, peer_advertised: bool) -> Result<bool, String> {
        let local = &sh.samehost;
        if local.mode == Mode::Never {
            return Ok(false);
        }
        let why = if !local.supported() {
            "this device has no same-host key table"
        } else if !peer_advertised {
            "the peer did not advertise the same-host path"
        } else {
            return Ok(true);
        };
        if local.mode == Mode::Require {
            return Err(why.to_string());
        }
        log::info!(target: LOG, "connection {token}: stays on TCP: {why}");
        Ok(false)
    }

    /// Passive side, accepting connection `token` for `qp`: the flags of the ACCEPT, after
    /// which `same_host_send_offer` sends our offer; Err when require mode refuses it.
    pub(super) fn same_host_accept_flags(&self, sh: &Shared, token: u64) -> Result<u16, String> {
        let advertised = self
            .conns
            .get(&token)
            .is_some_and(|c| c.same_host.peer_advertised);
        Ok(match Self::same_host_decide(sh, token, advertised)? {
            true => wire::FLAG_SAME_HOST,
            false => 0,
        })
    }

    /// Active side: the peer's ACCEPT carried `flags`. Sends our offer if both sides use the
    /// path. Returns false when require mode failed the connection instead.
    pub(super) fn same_host_accepted(
        &mut self,
        sh: &Shared,
        token: u64,
        qp: u32,
        flags: u16,
    ) -> bool {
        let peer = self.same_host_hello && flags & wire::FLAG_SAME_HOST != 0;
        match Self::same_host_decide(sh, token, peer) {
            Ok(true) => {
                self.same_host_agreed(sh, token, qp);
                true
            }
            Ok(false) => true,
            Err(why) => {
                log::error!(target: LOG, "qp {qp}: DAPLRS_SAME_HOST=require, but {why}: failing the connection");
                self.fail_qp(qp, Some(CmEvent::rejected_not_by_peer(qp)));
                false
            }
        }
    }

    /// Both sides use the path on `token` (`qp`'s connection). Set up at first use: our offer
    /// waits for the connection's first request: our QP's first post (`post_send`) or the
    /// peer's offer, which its first post sent (`same_host_offer`); both call
    /// `same_host_offer_if_pending`. A connection that never carries a request costs no ring, bell or board slot on either side, nor their
    /// system calls and page faults, which made a same-host connection twice a TCP one's CPU;
    /// the requests before the switch go over TCP, in order with those after. Require mode
    /// offers at once, so that the path carries every request, the first included.
    pub(super) fn same_host_agreed(&mut self, sh: &Shared, token: u64, qp: u32) {
        if sh.samehost.mode == Mode::Require {
            self.same_host_send_offer(sh, token, qp);
            return;
        }
        if let Some(c) = self.conns.get_mut(&token) {
            c.same_host.offer_pending = true;
        }
        if let Some(e) = self.qps.get_mut(&qp) {
            e.offer_on_post = true;
        }
    }

    /// The connection's first request, ours (`qp`'s first post) or the peer's (its offer):
    /// our offer, if it waits for that (`same_host_agreed`), goes now, ahead of anything we
    /// send the peer from here on. Returns whether it went.
    pub(super) fn same_host_offer_if_pending(&mut self, sh: &Shared, token: u64, qp: u32) -> bool {
        if self
            .conns
            .get(&token)
            .is_some_and(|c| c.same_host.offer_pending)
        {
            self.same_host_send_offer(sh, token, qp);
            return true;
        }
        if let Some(e) = self.qps.get_mut(&qp) {
            e.offer_on_post = false;
        }
        false
    }

    /// Queues our offer on `token` (after the handshake frame, or whatever went before on a
    /// connection set up at first use) and expects the peer's.
    pub(super) fn same_host_send_offer(&mut self, sh: &Shared, token: u64, qp: u32) {
        let Some(pd) = self.qps.get_mut(&qp).map(|e| {
            e.offer_on_post = false;
            e.pd
        }) else {
            return;
        };
        if let Some(c) = self.conns.get_mut(&token) {
            if std::mem::take(&mut c.same_host.offer_pending) {
                // Its pollers read it again: the answers to what it sends now come on the
                // socket until the peer switches.
                self.rewatch(token);
            }
        }
        // Our ring for what the peer sends; without one, the peer keeps writing to the socket.
        let ring = match Ring::create(sh.samehost.board_slot(token)) {
            Ok(r) => Some(Arc::new(r)),
            Err(e) => {
                log::info!(target: LOG, "connection {token}: no same-host ring ({e}): the peer's frames stay on TCP");
                None
            }
        };
        let ring_fd = ring.as_ref().and_then(|r| r.fd()).map(|fd| fd as u32);
        let Some(offer) = sh.samehost.offer(pd, ring_fd) else {
            return;
        };
        if let (Some(ring), Some(lock)) = (&ring, sh.samehost.table_lock()) {
            self.open_recv_window(qp, ring.clone(), lock);
        }
        if let Some(c) = self.conns.get_mut(&token) {
            c.same_host.expect_offer = true;
            c.same_host.incoming = ring;
            c.out
                .push_frame(Header::new(Kind::SameHost), offer.encode());
        }
        self.try_write(token);
    }

    /// Publishes `qp`'s posted receives in `ring` (ours, for the peer's frames), from now on
    /// as they are posted, for the peer to place its sends in. Not for a QP of a shared
    /// receive queue, whose receives any of its QPs may consume.
    fn open_recv_window(&mut self, qp: u32, ring: Arc<Ring>, lock: TableLock) {
        let Some(e) = self.qps.get_mut(&qp).filter(|e| e.srq.is_none()) else {
            return;
        };
        e.recv_window = Some(RecvWindow {
            ring,
            lock,
            published: e.recvs_done,
        });
        self.publish_recvs(qp);
    }

    /// Publishes the posted receives of `qp` not published yet, as far as the window's slots
    /// allow (ring.rs `RECV_SLOTS` past the first not consumed).
    pub(super) fn publish_recvs(&mut self, qp: u32) {
        let Some(e) = self.qps.get_mut(&qp) else {
            return;
        };
        let Some(w) = e.recv_window.as_mut() else {
            return;
        };
        let limit = e.recvs_done + e.rq.len().min(shm::ring::RECV_SLOTS) as u64;
        if w.published >= limit {
            return;
        }
        while w.published < limit {
            let Some(wr) = e.rq.get((w.published - e.recvs_done) as usize) else {
                break;
            };
            let sgl = wr.sgl.iter().map(|s| (s.addr, s.length, s.lkey));
            w.ring.publish_recv(w.published, sgl);
            w.published += 1;
        }
        w.ring.set_published(w.published);
    }

    /// One of `qp`'s own receives was consumed by the peer (a SEND, WRITE_IMM or PLACED
    /// frame): the window moves on.
    pub(super) fn recv_consumed(&mut self, qp: u32) {
        if let Some(e) = self.qps.get_mut(&qp) {
            e.recvs_done += 1;
        }
        self.publish_recvs(qp);
    }

    /// A PLACED frame `h` from the peer: the message is in our receive `h.addr`, which must be
    /// the next to consume, and taken by the peer in our window; it completes, no answer.
    /// Anything else is the peer breaking the protocol.
    pub(super) fn placed(&mut self, token: u64, qp: u32, h: &Header) -> Outcome {
        let Some(e) = self.qps.get_mut(&qp) else {
            return Outcome::Broken;
        };
        let taken = e
            .recv_window
            .as_ref()
            .is_some_and(|w| h.addr == e.recvs_done && w.ring.recv_taken(h.addr));
        let imm = h.flags & wire::FLAG_IMMEDIATE != 0;
        let fits = e.rq.front().is_some_and(|wr| {
            imm || u64::from(h.length) <= wr.sgl.iter().map(|s| u64::from(s.length)).sum()
        });
        if !taken || !fits {
            self.protocol_error(token, "PLACED for a receive not taken, or too long for it");
            return Outcome::Broken;
        }
        let Some(wr) = e.rq.pop_front() else {
            return Outcome::Broken;
        };
        let rcq = e.recv_cq.clone();
        self.push_wc(
            &rcq,
            WorkCompletion {
                imm: imm.then_some(h.key),
                solicited: h.flags & wire::FLAG_SOLICITED != 0,
                ..wr.completion(
                    WcStatus::Success,
                    if imm {
                        WcOpcode::RecvRdmaImm
                    } else {
                        WcOpcode::Recv
                    },
                    h.length,
                    qp,
                )
            },
        );
        self.recv_consumed(qp);
        Outcome::Done
    }

    /// A send or write-with-immediate done here, now, if the connection has the peer's table
    /// and ring, the QP has nothing outstanding or fenced, and the peer has published the
    /// receive it consumes: the send's data is placed in that receive (ring.rs), a write's in
    /// the memory its rkey names, and a PLACED frame tells the peer, which completes its
    /// receive when it next looks (its CPU is not needed for the data). Completes the request
    /// and returns true; false (nothing done, nothing taken) sends it through the ring as
    /// before, which also produces every error (a receive too small, a bad key).
    pub(super) fn try_same_host_send(&mut self, sh: &Shared, qp: u32, wr: &SendWr) -> bool {
        if !matches!(wr.op, SendOp::Send | SendOp::RdmaWriteImm { .. }) {
            return false;
        }
        let Some(e) = self.qps.get(&qp) else {
            return false;
        };
        if e.state != QpState::Connected || !e.outstanding.is_empty() || !e.fenced.is_empty() {
            return false;
        }
        let Some((token, peer, ring)) = e.conn.and_then(|t| {
            let c = self.conns.get(&t)?;
            Some((t, c.same_host.peer.clone()?, c.same_host.outgoing.clone()?))
        }) else {
            return false;
        };
        let k = e.sent_to_recvs;
        let Some((total, placed)) = lane::send_inline(sh, &peer, &ring, e.pd, k, wr) else {
            return false;
        };
        let cq = e.send_cq.clone();
        if let Some(e) = self.qps.get_mut(&qp) {
            e.sent_to_recvs += 1;
        }
        self.push_wc(
            &cq,
            WorkCompletion::new(wr.wr_id, WcStatus::Success, wr.op.opcode(), total, qp)
                .with_ctx(wr.ctx),
        );
        if let Some(c) = self.conns.get_mut(&token) {
            c.out.push_frame(placed, Vec::new());
        }
        self.try_write(token);
        // After the frame is written: the lane's frames follow it (lane.rs).
        self.open_lane(qp);
        true
    }

    /// Opens `qp`'s lane (lane.rs) after an inline post: its next inline posts need the
    /// engine no more. With the QP's sends if the connection's frames go through the peer's
    /// ring, all written (the lane's PLACED frames follow them), and the peer's reader gave
    /// us its bell (the lane has no socket for a doorbell). Not on a connection that raises
    /// the target signal: a post then also names the thread its answers' signals go to
    /// (`note_poster`).
    fn open_lane(&mut self, qp: u32) {
        let Some(e) = self.qps.get_mut(&qp) else {
            return;
        };
        // An open lane's count of the peer's receives is the current one.
        e.close_lane();
        let Some(c) = e.conn.and_then(|t| self.conns.get(&t)) else {
            return;
        };
        let Some(peer) = c.same_host.peer.clone().filter(|_| !c.signalled) else {
            return;
        };
        let sends = c
            .same_host
            .writing_ring()
            .filter(|r| r.has_bell() && c.out.is_empty())
            .map(|ring| lane::Sends {
                ring: ring.clone(),
                next_recv: e.sent_to_recvs,
            });
        e.lane.open(peer, e.pd, e.send_cq.clone(), qp, sends);
    }

    /// The peer's offer arrived on `token` (established, `qp`): map its table if the offer
    /// checks out; else the connection stays on TCP (or fails, in require mode).
    pub(super) fn same_host_offer(&mut self, sh: &Shared, token: u64, qp: u32, p: &[u8]) {
        // The peer's first request may come before ours: then its offer is answered.
        if self.same_host_offer_if_pending(sh, token, qp) {
            if let Some(c) = self.conns.get_mut(&token) {
                c.same_host.expect_offer = true;
            }
        }
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if !std::mem::take(&mut c.same_host.expect_offer) {
            self.protocol_error(token, "SAME_HOST offer not asked for");
            return;
        }
        let Some(offer) = wire::SameHostOffer::decode(p) else {
            self.protocol_error(token, "malformed SAME_HOST offer");
            return;
        };
        match sh.samehost.attach(&offer) {
            Ok(table) => {
                log::info!(target: LOG, "connection {token} (qp {qp}): RDMA read/write with pid {} on the same-host path", table.pid());
                sh.samehost
                    .stats
                    .attached
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                c.same_host.peer = Some(Arc::new(table));
                self.same_host_open_ring(sh, token, qp, &offer);
            }
            Err(why) if shm::peer_descriptor_gone(offer.pid, offer.fd) => {
                log::info!(target: LOG, "connection {token} (qp {qp}): the peer is closing it ({why})");
            }
            Err(why) if sh.samehost.mode == Mode::Require => {
                log::error!(target: LOG, "connection {token} (qp {qp}): DAPLRS_SAME_HOST=require, but {why}: failing the connection");
                self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
            }
            Err(why) => {
                log::info!(target: LOG, "connection {token} (qp {qp}): stays on TCP: {why}");
                self.same_host_decline(token);
            }
        }
    }

    /// Tells the peer on `token` that its offer was of no use here (a SWITCH with
    /// FLAG_DECLINED): our frames stay on the socket, and the peer stops expecting any in its
    /// ring, which would keep it from serving the socket's frames the cheap ways (the target
    /// signal, ../sigio.rs; a send streamed into its receive).
    fn same_host_decline(&mut self, token: u64) {
        if let Some(c) = self.conns.get_mut(&token) {
            let mut h = Header::new(Kind::Switch);
            h.flags = wire::FLAG_DECLINED;
            c.out.push_frame(h, Vec::new());
        }
        self.try_write(token);
    }

    /// After the peer's offer checked out: maps the ring it names and sends SWITCH, after
    /// which our frames go into that ring (`Conn::flush_out`). Without a ring the connection
    /// keeps writing to the socket (or fails, in require mode).
    fn same_host_open_ring(
        &mut self,
        sh: &Shared,
        token: u64,
        qp: u32,
        offer: &wire::SameHostOffer,
    ) {
        let peer = self
            .conns
            .get(&token)
            .and_then(|c| c.same_host.peer.clone());
        let opened = match (offer.ring_fd, peer) {
            (Some(fd), Some(peer)) => Ring::open(peer.process(), fd),
            (None, _) => Err("the peer offered no ring".to_string()),
            (Some(_), None) => return, // the connection went meanwhile
        };
        match opened {
            Ok(ring) => {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.same_host.outgoing = Some(Arc::new(ring));
                    c.out.push_frame(Header::new(Kind::Switch), Vec::new());
                    c.same_host.switch_at = Some(c.out.pushed());
                }
                self.try_write(token);
            }
            Err(why)
                if offer
                    .ring_fd
                    .is_some_and(|fd| shm::peer_descriptor_gone(offer.pid, fd)) =>
            {
                log::info!(target: LOG, "connection {token} (qp {qp}): the peer is closing it ({why})");
            }
            Err(why) if sh.samehost.mode == Mode::Require => {
                log::error!(target: LOG, "connection {token} (qp {qp}): DAPLRS_SAME_HOST=require, but {why}: failing the connection");
                self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
            }
            Err(why) => {
                log::info!(target: LOG, "connection {token} (qp {qp}): our frames stay on TCP: {why}");
                self.same_host_decline(token);
            }
        }
    }

    /// The peer's SWITCH arrived on `token`: its next frames are in our ring, and what
    /// followed the SWITCH on the socket are doorbells; with FLAG_DECLINED, they stay on the
    /// socket and our ring goes. Returns false if the connection was dropped for it (a SWITCH
    /// we did not offer a ring for, or a second one).
    pub(super) fn same_host_switch(&mut self, sh: &Shared, token: u64, flags: u16) -> bool {
        if flags & wire::FLAG_DECLINED != 0 {
            self.same_host_declined(sh, token);
            return true;
        }
        let Some(c) = self.conns.get_mut(&token) else {
            return false;
        };
        let Some(ring) = c
            .same_host
            .incoming
            .as_ref()
            .filter(|_| !c.same_host.peer_switched)
        else {
            self.protocol_error(token, "SWITCH without our ring");
            return false;
        };
        // The peer has mapped the ring: the descriptor has done its work.
        ring.close_fd();
        c.same_host.peer_switched = true;
        // The progress thread watches the ring in its poll set, not in its set of returned
        // connections (which sees the socket only).
        if c.parked.take().is_some() {
            self.wake_needed = true;
        }
        c.dec.discard_buffered();
        sh.samehost
            .stats
            .rings
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        log::info!(target: LOG, "connection {token}: the peer's frames come through our ring");
        // Its pollers now look at the ring, not the socket (readiness.rs).
        self.rewatch(token);
        true
    }

    /// The peer will not write to our ring (`same_host_decline`): it goes, with the receive
    /// window published in it (the peer, which could not map the ring, placed nothing there:
    /// anything placed breaks the connection, rather than leave a receive never completed).
    /// A peer that declines after switching breaks the protocol; one that declines an offer
    /// we made without a ring said nothing we need.
    fn same_host_declined(&mut self, sh: &Shared, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if c.same_host.peer_switched {
            self.protocol_error(token, "SWITCH declined after SWITCH");
            return;
        }
        let Some(ring) = c.same_host.incoming.take() else {
            return;
        };
        ring.close_fd();
        log::info!(target: LOG, "connection {token}: the peer's frames stay on TCP (it declined our ring)");
        sh.samehost
            .stats
            .declined
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Phase::Established { qp } = c.phase else {
            return;
        };
        let placed = self.qps.get_mut(&qp).and_then(|e| {
            let w = e.recv_window.take()?;
            Some(w.withdraw(e.recvs_done))
        });
        // A peer that placed messages in our receives had our ring: declining is a lie.
        if placed.is_some_and(|p| !p.is_empty()) {
            self.protocol_error(token, "SWITCH declined after placing in our receives");
        }
    }

    /// Wakes the peer's writer that waits for room in our ring: the bell of its ring (which it
    /// watches while it waits) or a doorbell byte if our own frames already go through that
    /// ring, else a DOORBELL frame on the socket.
    pub(super) fn ring_peer(&mut self, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if let Some(ring) = c.same_host.writing_ring() {
            wake_ring_reader(ring, c.stream.as_raw_fd());
            return;
        }
        c.out.push_frame(Header::new(Kind::Doorbell), Vec::new());
        self.try_write(token);
    }

    /// An RDMA read or write done here, now, if the connection has the peer's table and the
    /// QP has nothing outstanding or fenced (so completion order and fences hold trivially).
    /// Returns whether it was done and completed; if not, the caller sends it over TCP, which
    /// also produces every error (local ones and the target's) as it always has.
    pub(super) fn try_same_host(&mut self, sh: &Shared, qp: u32, wr: &SendWr) -> bool {
        if !matches!(wr.op, SendOp::RdmaRead { .. } | SendOp::RdmaWrite { .. }) {
            return false;
        }
        let Some(e) = self.qps.get(&qp) else {
            return false;
        };
        if e.state != QpState::Connected || !e.outstanding.is_empty() || !e.fenced.is_empty() {
            return false;
        }
        let Some(peer) = e
            .conn
            .and_then(|t| self.conns.get(&t)?.same_host.peer.clone())
        else {
            return false;
        };
        let Some(total) = lane::rdma_inline(sh, &peer, e.pd, wr) else {
            return false;
        };
        let cq = e.send_cq.clone();
        self.push_wc(
            &cq,
            WorkCompletion::new(wr.wr_id, WcStatus::Success, wr.op.opcode(), total, qp)
                .with_ctx(wr.ctx),
        );
        self.open_lane(qp);
        true
    }
}
