//! The receive side of a QP: receives given to the provider as it has room,
//! or fed from a port's eager buffers or an SRQ of ours (bounce buffers);
//! their completions, in order, and the receipts owed to the peer.

use super::*;
use crate::srq::Member;

impl OfiQp {
    /// A receive of the SRQ completed on this QP's endpoint. Returns whether
    /// the connection broke under it (as `completed`).
    pub(crate) fn srq_received(
        &self,
        token: u32,
        result: Result<u32, WcStatus>,
        data: Option<u64>,
        out: &mut VecDeque<WorkCompletion>,
    ) -> bool {
        let Some(taken) = self.srq.as_ref().and_then(|srq| srq.take(token)) else {
            log::debug!("QP {}: completion of SRQ receive {token}, gone", self.num);
            return false;
        };
        let (wc, refused) = self.shared_completion(taken, result, data);
        out.push_back(wc);
        if refused {
            let mut inner = self.inner.lock();
            inner.broke = true;
            inner.break_pending = true;
        }
        refused
    }

    /// The completion of an SRQ's receive `taken` (wr_id, context) this QP consumed, and
    /// whether it named a window it may not invalidate (it then fails and
    /// the connection breaks).
    pub(super) fn shared_completion(
        &self,
        taken: (u64, WrContext),
        result: Result<u32, WcStatus>,
        data: Option<u64>,
    ) -> (WorkCompletion, bool) {
        let (wr_id, ctx) = taken;
        let num = self.num;
        let (invalidated, refused) = self.invalidation(data);
        let imm = data.filter(|d| d & WRITE_IMM != 0);
        let wc = match (refused, result) {
            (true, _) => {
                WorkCompletion::new(wr_id, WcStatus::LocalProtection, WcOpcode::Recv, 0, num)
            }
            (false, Err(status)) => WorkCompletion::new(wr_id, status, WcOpcode::Recv, 0, num),
            (false, Ok(got)) => WorkCompletion {
                solicited: true,
                invalidated,
                imm: imm.map(|d| d as u32),
                ..WorkCompletion::new(
                    wr_id,
                    WcStatus::Success,
                    imm.map_or(WcOpcode::Recv, |_| WcOpcode::RecvRdmaImm),
                    imm.map_or(got, |d| (d >> 34) as u32),
                    num,
                )
            },
        };
        (wc.with_ctx(ctx), refused)
    }

    /// The QP's SRQ where it is a pool of ours (see `srq`).
    pub(super) fn pooled_srq(&self) -> Option<&Arc<OfiSrq>> {
        self.srq.as_ref().filter(|srq| srq.srx().is_none())
    }

    /// Posts the bounce buffers not posted (an SRQ of ours).
    /// One the provider refuses for now (busy) is posted again by the
    /// progress thread (`retry_held`): with none posted, nothing would come
    /// back here.
    pub(super) fn post_bounces(&self, dev: &Domain, srq: &OfiSrq, inner: &mut Inner) -> Result<()> {
        let ep = Self::ep_of(inner).ok_or(Error::BadState)?;
        let count = crate::bounce::BOUNCES.min(self.depths.0);
        let len = srq.bounce_len();
        let tag = self.rdm.then_some(inner.tag);
        let posted = inner.bounces.post_all(dev, ep, count, len, tag, |slot| {
            self.context(BOUNCE | slot as u32)
        });
        match &posted {
            Err(Error::NoResource(Resource::WorkQueue)) => dev.retry_later(self.num),
            Err(e) => log::warn!("QP {}: bounce buffers not posted: {e:?}", self.num),
            Ok(()) => inner.feeds.received(),
        }
        posted
    }

    /// A bounce buffer completed: what landed, in order, waits in the SRQ for
    /// a receive, and this QP's oldest waiting messages take those posted.
    pub(super) fn bounce_landed(
        &self,
        inner: &mut Inner,
        landed: Landed,
        out: &mut VecDeque<WorkCompletion>,
    ) {
        let Some(srq) = self.pooled_srq() else { return };
        let mut ready = Vec::new();
        let cancelled = inner.bounces.landed(landed, &mut ready);
        if inner.state == QpState::Error || Self::ep_of(inner).is_none() {
            // Flushed as the connection ended: nothing of the consumer's was in it.
            return;
        }
        if cancelled {
            if let Some(dev) = self.dev.upgrade() {
                let _ = self.post_bounces(&dev, srq, inner);
            }
            return;
        }
        for landed in ready {
            srq.arrived(self.num, landed);
        }
        self.serve_locked(inner, srq, out);
    }

    /// Copies this QP's waiting messages into the SRQ's receives while it
    /// has them and the oldest waiting message is this QP's; each receive
    /// completes into `out` (the receive CQ's queue) and its bounce buffer is
    /// posted again.
    pub(super) fn serve_locked(
        &self,
        inner: &mut Inner,
        srq: &OfiSrq,
        out: &mut VecDeque<WorkCompletion>,
    ) {
        let mut served = false;
        while let Some((landed, wr)) = srq.take_for(self.num) {
            let result = match landed.result {
                Ok(len) => {
                    crate::srq::copy_into(&wr, inner.bounces.take(landed.slot, len as usize))
                }
                Err(status) => {
                    inner.bounces.take(landed.slot, 0);
                    Err(status)
                }
            };
            let (wc, refused) = self.shared_completion((wr.wr_id, wr.ctx), result, landed.data);
            self.give_receipts(inner, std::iter::once(&wc));
            out.push_back(wc);
            if refused {
                inner.broke = true;
                inner.break_pending = true;
            }
            served = true;
        }
        if served {
            if let Some(dev) = self.dev.upgrade() {
                let _ = self.post_bounces(&dev, srq, inner);
            }
        }
    }

    /// Gives the provider the waiting receives it has room for, in order
    /// (fed from eager buffers: those for the large messages announced).
    pub(super) fn feed_recvs(&self, inner: &mut Inner) -> Result<()> {
        if Self::receives_eagerly(inner) {
            return self.give_announced(inner);
        }
        while !inner.pending.is_empty() && self.may_give_recv(inner) {
            let (token, wr) = inner.pending.pop_front().expect("checked");
            if let Err(e) = self.give_recv(inner, token, &wr) {
                // Kept, in its place, for the next completion to retry.
                inner.pending.push_front((token, wr));
                return Err(e);
            }
        }
        Ok(())
    }

    /// Whether the QP may give the provider one more receive: below its cap
    /// and, over a port, its own slot or a spare one (else it waits for one,
    /// woken by `retry_held`: `Port::take_slot`).
    pub(super) fn may_give_recv(&self, inner: &Inner) -> bool {
        if inner.recvs_given >= inner.rx_cap {
            return false;
        }
        match &inner.port {
            Some(port) => port.take_slot(self.num, inner.recvs_given),
            None => true,
        }
    }

    /// Posts receive `token` (its room taken by `may_give_recv`); a refusal
    /// gives the room back. Over a port a busy provider (its receive entries
    /// also hold messages that came before their receive) keeps the receive
    /// waiting, for the progress thread to post (`retry_held`).
    pub(super) fn give_recv(&self, inner: &mut Inner, token: u32, wr: &RecvWr) -> Result<()> {
        match self.post_recv_now(inner, token, wr) {
            Ok(()) => {
                inner.recvs_given += 1;
                inner.given.push(token);
                Ok(())
            }
            Err(e) => {
                if let Some(port) = &inner.port {
                    let woken = port.returned(inner.recvs_given + 1);
                    if let Some(dev) = self.dev.upgrade() {
                        for qp in woken {
                            dev.retry_later(qp);
                        }
                        // shm's receive entries also hold the messages that came
                        // before their receive: full, it says ENOMEM, not EAGAIN.
                        let busy = e == Error::NoResource(Resource::WorkQueue)
                            || (self.rdm && e == Error::NoResource(Resource::Memory));
                        if busy {
                            dev.retry_later(self.num);
                        }
                    }
                }
                Err(e)
            }
        }
    }

    /// A receive the provider held is done (completed, or given back): its
    /// room frees (a spare slot of the port wakes a QP waiting for one).
    pub(super) fn recv_done(&self, inner: &mut Inner, token: u32) {
        let had = inner.recvs_given;
        inner.recvs_given = had.saturating_sub(1);
        let token = token & TOKEN_MASK;
        if let Some(i) = inner.given.iter().position(|&t| t == token) {
            inner.given.swap_remove(i);
        }
        if let Some(port) = &inner.port {
            let woken = port.returned(had);
            if let Some(dev) = self.dev.upgrade() {
                for qp in woken {
                    dev.retry_later(qp);
                }
            }
        }
    }

    /// A receive's completion: its length (or error) and remote CQ data (an
    /// invalidation, or a write with immediate data); then the receives
    /// waiting for the provider's room get it.
    pub(super) fn received(
        &self,
        inner: &mut Inner,
        token: u32,
        result: Result<u32, WcStatus>,
        data: Option<u64>,
        out: &mut VecDeque<WorkCompletion>,
    ) {
        self.fill_recv(inner, token, result, data, out);
        self.recv_done(inner, token);
        if Self::receives_eagerly(inner) {
            self.match_arrivals(inner, out);
        } else if inner.state == QpState::Connected {
            if let Err(e) = self.feed_recvs(inner) {
                log::debug!("QP {}: receives wait for room: {e:?}", self.num);
            }
        }
    }

    /// Receive `token` is done (`result`, `data`: as `received`): its slot
    /// is marked, the receives done in order go to `out`, and the peer is
    /// owed a receipt of them.
    pub(super) fn fill_recv(
        &self,
        inner: &mut Inner,
        token: u32,
        result: Result<u32, WcStatus>,
        data: Option<u64>,
        out: &mut VecDeque<WorkCompletion>,
    ) {
        let num = self.num;
        let (invalidated, refused) = self.invalidation(data);
        let imm = data.filter(|d| d & WRITE_IMM != 0);
        inner.recvs.mark(token, |s| match (refused, result) {
            (true, _) => WorkCompletion::new(s.wr_id, WcStatus::LocalProtection, s.opcode, 0, num),
            (false, Err(status)) => WorkCompletion::new(s.wr_id, status, s.opcode, 0, num),
            (false, Ok(got)) => WorkCompletion {
                solicited: true,
                invalidated,
                imm: imm.map(|d| d as u32),
                ..WorkCompletion::new(
                    s.wr_id,
                    WcStatus::Success,
                    imm.map_or(s.opcode, |_| WcOpcode::RecvRdmaImm),
                    imm.map_or(got, |d| (d >> 34) as u32),
                    num,
                )
            },
        });
        if refused {
            // As on an RDMA NIC, the receive fails and the connection breaks.
            inner.broke = true;
            inner.break_pending = true;
        }
        let before = out.len();
        inner.recvs.release(out);
        self.give_receipts(inner, out.range(before..));
    }

    /// Whether the QP's receives are fed from its port's eager buffers
    /// (`eager`), not matched by the provider.
    pub(super) fn receives_eagerly(inner: &Inner) -> bool {
        inner.port.is_some() && inner.tag & DIRECT == 0
    }

    /// A message for this connection landed in the eager buffers of `port`
    /// (`eager`): it takes the oldest receive waiting, or waits for one.
    /// Returns whether the connection is to break (as `completed`).
    pub(crate) fn arrived(
        &self,
        port: &Arc<Port>,
        arrival: Landing,
        out: &mut VecDeque<WorkCompletion>,
    ) -> bool {
        let mut inner = self.inner.lock();
        let ours = inner.port.as_ref().is_some_and(|p| Arc::ptr_eq(p, port));
        if !ours || !matches!(inner.state, QpState::Connected | QpState::Connecting) {
            // Another port's connection (a peer naming a connection not its
            // own), or one that ended: nobody's receive takes it.
            return false;
        }
        match arrival {
            Ok(arrival) => inner.arrived.push_back(arrival),
            Err(status) => {
                log::warn!("QP {}: eager buffer failed: {status:?}", self.num);
                inner.broke = true;
                inner.break_pending = true;
            }
        }
        if inner.arrived.len() > self.cap.max_recv_wr as usize + ARRIVED_SLACK {
            log::warn!("QP {}: the peer sends beyond our receives", self.num);
            inner.arrived.clear();
            inner.broke = true;
            inner.break_pending = true;
        }
        self.match_arrivals(&mut inner, out);
        let refused = std::mem::take(&mut inner.break_pending);
        refused && inner.state == QpState::Connected
    }

    /// Pairs what arrived with the receives waiting, oldest with oldest: a
    /// short message is copied into its receive, which completes into `out`
    /// (the receive CQ's queue); a large one's receive goes to the provider
    /// (`give_announced`), and waits there while that has no room.
    pub(super) fn match_arrivals(&self, inner: &mut Inner, out: &mut VecDeque<WorkCompletion>) {
        loop {
            if self.give_announced(inner).is_err() {
                return;
            }
            if inner.pending.is_empty()
                || !matches!(inner.arrived.front(), Some(Arrival::Eager { .. }))
            {
                return;
            }
            let Some(Arrival::Eager { bytes, data }) = inner.arrived.pop_front() else {
                return;
            };
            let (token, wr) = inner.pending.pop_front().expect("checked");
            let result = crate::srq::copy_into(&wr, &bytes);
            if result.is_err() {
                // A message longer than its receive: as on an RDMA NIC the
                // receive fails and the connection breaks.
                inner.broke = true;
                inner.break_pending = true;
            }
            self.fill_recv(inner, token, result, data, out);
        }
    }

    /// `match_arrivals` from outside a read of the receive CQ: completions
    /// into its queue (taken before the QP's lock), then the receipts due.
    pub(super) fn match_waiting(&self) {
        self.recv_cq.deliver(|out| {
            let mut inner = self.inner.lock();
            if Self::receives_eagerly(&inner) && !inner.arrived.is_empty() {
                self.match_arrivals(&mut inner, out);
            }
        });
        self.send_receipt();
        if std::mem::take(&mut self.inner.lock().break_pending) {
            self.broken();
        }
    }

    /// Gives the provider the waiting receives of the large messages
    /// announced at the front of what arrived, in order, while it has room.
    pub(super) fn give_announced(&self, inner: &mut Inner) -> Result<()> {
        while matches!(inner.arrived.front(), Some(Arrival::Large)) && !inner.pending.is_empty() {
            if !self.may_give_recv(inner) {
                return Err(Error::NoResource(Resource::WorkQueue));
            }
            let (token, wr) = inner.pending.pop_front().expect("checked");
            if let Err(e) = self.give_recv(inner, token, &wr) {
                inner.pending.push_front((token, wr));
                return Err(e);
            }
            inner.arrived.pop_front();
        }
        Ok(())
    }

    /// Receives completed (`done`, in order): the peer learns how many of its
    /// messages our receives took, each whole, so far (the first failed one
    /// ends the count: the connection breaks).
    pub(super) fn give_receipts<'a>(
        &self,
        inner: &mut Inner,
        done: impl Iterator<Item = &'a WorkCompletion>,
    ) {
        if !self.rdm || inner.receipts_over {
            return;
        }
        let before = inner.received;
        for wc in done {
            if wc.status != WcStatus::Success {
                inner.receipts_over = true;
                break;
            }
            inner.received += 1;
        }
        if inner.received != before && self.dev.upgrade().is_some_and(|d| d.receipts) {
            self.receipt_due.store(true, Ordering::Release);
        }
    }

    /// Whether our receives took messages the peer has not been told of.
    pub(crate) fn receipt_due(&self) -> bool {
        self.receipt_due.load(Ordering::Acquire)
    }

    /// Tells the peer how many of its messages our receives took: one RDMA
    /// write of the count and its complement into the peer's receipt words
    /// (`farewell`), injected (no completion, nothing to wait for), on the
    /// fabric, so that the peer's next read of its request CQ finds it with
    /// no thread of ours in between (a socket frame read by a blocked thread
    /// cost a polling pair about 11 ms a round trip: docs/libfabric.md,
    /// Receipts). Called with no lock of the QP's CQs held. A busy provider
    /// leaves it due, for the progress thread to write (`retry_held`).
    pub(crate) fn send_receipt(&self) {
        if !self.receipt_due.swap(false, Ordering::AcqRel) {
            return;
        }
        let inner = self.inner.lock();
        let open = inner.state != QpState::Error && inner.dest != FI_ADDR_UNSPEC;
        let (Some(ep), true, key) = (Self::ep_of(&inner), open, inner.peer.farewell_key) else {
            return;
        };
        if key == 0 || Self::peer_gone(&inner) {
            return;
        }
        let words = [inner.received, !inner.received];
        let at = inner
            .peer
            .farewell_address
            .wrapping_add(crate::farewell::RECEIPT_OFFSET);
        // SAFETY: an enabled endpoint and a peer in its AV; the 16 bytes are
        // copied before the call returns (an inject).
        let rc = unsafe {
            fi::fi_inject_write(
                ep,
                words.as_ptr().cast(),
                std::mem::size_of_val(&words),
                inner.dest,
                at,
                key,
            )
        };
        drop(inner);
        if rc == -(fi::FI_EAGAIN as isize) {
            self.receipt_due.store(true, Ordering::Release);
            if let Some(dev) = self.dev.upgrade() {
                dev.retry_later(self.num);
            }
        } else if rc < 0 {
            log::warn!("QP {}: receipt: {}", self.num, fi::strerror(rc as i32));
        }
    }

    /// What a receive's remote CQ data asks: the rkey of a window of ours
    /// invalidated (Some), and whether it named none of this QP's protection
    /// domain (the receive then fails).
    pub(super) fn invalidation(&self, data: Option<u64>) -> (Option<u32>, bool) {
        let Some(dev) = self.dev.upgrade() else {
            return (None, false);
        };
        // 4 bytes of CQ data are an rkey, unless read as a write's (`remote_data`).
        let flagged = |d: &u64| d & WRITE_IMM == 0 && (d & INVALIDATE != 0 || !dev.remote_data());
        let Some(rkey) = data.filter(flagged).map(|d| d as u32) else {
            return (None, false);
        };
        let done = dev.invalidate_window(rkey, self.pd);
        (done.then_some(rkey), !done)
    }

    pub(super) fn post_recv_now(&self, inner: &Inner, token: u32, wr: &RecvWr) -> Result<()> {
        let ep = Self::ep_of(inner).ok_or(Error::BadState)?;
        let dev = self.dev.upgrade().ok_or(Error::NoDevice)?;
        let (iov, mut desc) = io_vectors(&dev, &wr.sgl);
        let context = self.context(token | RECV_BIT);
        let flags = fi::FI_COMPLETION as u64;
        // SAFETY: an enabled endpoint; the vectors live for the call (the provider
        // copies the message description, not the buffers, which stay registered).
        let rc = unsafe {
            if self.rdm {
                // Over a port: this connection's messages only (their tag).
                let msg = fi::fi_msg_tagged {
                    msg_iov: or_null(&iov).cast(),
                    desc: or_null_mut(&mut desc),
                    iov_count: iov.len(),
                    addr: FI_ADDR_UNSPEC,
                    // Fed from eager buffers, the provider holds a receive
                    // only for a large message announced.
                    tag: if Self::receives_eagerly(inner) {
                        inner.tag | LARGE
                    } else {
                        inner.tag
                    },
                    ignore: IMM_FIELDS,
                    context,
                    data: 0,
                };
                fi::fi_trecvmsg(ep, &msg, flags)
            } else {
                let msg = fi::fi_msg {
                    msg_iov: or_null(&iov).cast(),
                    desc: or_null_mut(&mut desc),
                    iov_count: iov.len(),
                    context,
                    addr: FI_ADDR_UNSPEC,
                    ..Default::default()
                };
                fi::fi_recvmsg(ep, &msg, flags)
            }
        };
        crate::check(rc, "fi_recvmsg", Error::NoResource(Resource::WorkQueue))?;
        inner.feeds.received();
        Ok(())
    }
}

/// An SRQ of ours asks its QPs (`srq::Member`).
impl Member for OfiQp {
    /// A receive was posted to the SRQ (of ours) while a message of this QP
    /// waited for one: it completes on the QP's receive CQ.
    fn serve_srq(&self, srq: &OfiSrq) {
        self.recv_cq.deliver(|out| {
            let mut inner = self.inner.lock();
            self.serve_locked(&mut inner, srq, out);
        });
        self.send_receipt();
        if std::mem::take(&mut self.inner.lock().break_pending) {
            self.broken();
        }
    }

    /// The SRQ's receives grew beyond the bounce buffers posted: those are
    /// asked back, and posted again longer as their cancels complete.
    fn lengthen_bounces(&self, len: usize) {
        let mut inner = self.inner.lock();
        let Some(ep) = Self::ep_of(&inner) else {
            return;
        };
        if inner.state == QpState::Error {
            return;
        }
        inner
            .bounces
            .cancel_shorter(ep, len, |slot| self.context(BOUNCE | slot as u32));
    }
}
