//! The initiator side of the TCP transport: requests posted on a queue pair become frames in
//! post order (behind fences and the read limit), and the target's answers complete them in
//! order.

use super::super::keys::Keys;
use super::*;

impl Engine {
    // ---- posting -------------------------------------------------------------------------------

    pub(super) fn complete(&mut self, qp: u32, o: &Outstanding, status: WcStatus) {
        let Some(e) = self.qps.get(&qp) else { return };
        let cq = e.send_cq.clone();
        self.push_wc(
            &cq,
            WorkCompletion::new(o.wr_id, status, o.opcode, o.len, qp).with_ctx(o.ctx),
        );
    }

    /// Completes local operations that reached the head of the queue.
    pub(super) fn complete_local_heads(&mut self, qp: u32) {
        loop {
            let head_local = self
                .qps
                .get(&qp)
                .and_then(|e| e.outstanding.front())
                .and_then(|o| o.local);
            let Some(status) = head_local else { break };
            let Some(o) = self
                .qps
                .get_mut(&qp)
                .and_then(|e| e.outstanding.pop_front())
            else {
                break;
            };
            self.complete(qp, &o, status);
            if status != WcStatus::Success {
                self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
                return;
            }
        }
        let done = self
            .qps
            .get(&qp)
            .map(|e| e.graceful_pending && e.outstanding.is_empty() && e.fenced.is_empty())
            .unwrap_or(false);
        if done {
            self.finish_disconnect(qp);
        }
    }

    pub(crate) fn post_send(&mut self, sh: &Shared, qp: u32, wr: SendWr) -> Result<()> {
        self.note_poster(qp);
        let e = self.qps.get_mut(&qp).ok_or_else(bad_state)?;
        // A post the lane declined: the engine's from here, the index of the peer's next
        // receive included (lane.rs); `try_same_host` and `try_same_host_send` open it again.
        e.close_lane();
        let opcode = wr.op.opcode();
        match e.state {
            QpState::Connected => {}
            QpState::Error => {
                let cq = e.send_cq.clone();
                self.push_wc(
                    &cq,
                    WorkCompletion::flushed(wr.wr_id, opcode, qp).with_ctx(wr.ctx),
                );
                return Ok(());
            }
            _ => return Err(bad_state()),
        }
        if e.outstanding.len() + e.fenced.len() >= e.cap.max_send_wr.max(1) as usize {
            return Err(Error::NoResource(Resource::WorkQueue));
        }
        let Some(token) = e.conn else {
            return Err(bad_state());
        };
        if e.offer_on_post {
            // The connection's first request: the same-host path is set up now, this request
            // going over TCP ahead of the switch (samehost.rs, `same_host_agreed`).
            self.same_host_offer_if_pending(sh, token, qp);
            return self.post_send(sh, qp, wr);
        }
        // Its pollers read it at their next look (readiness.rs), on either CQ: the answer
        // completes into the send CQ, a message the peer sends meanwhile into the receive CQ.
        e.send_cq.readiness.note_posted(token);
        if e.recv_cq.id != e.send_cq.id {
            e.recv_cq.readiness.note_posted(token);
        }
        if let SendOp::BindMw { new_rkey, .. } = &wr.op {
            // The window carries its new rkey from the post on (the next bind derives from
            // it), even if the bind itself waits behind a fence.
            if let Some(w) = sh
                .mws
                .lock()
                .get(&(new_rkey >> 8))
                .and_then(|w| w.upgrade())
            {
                w.note_posted(*new_rkey);
            }
        }
        let reads_out = e
            .outstanding
            .iter()
            .filter(|o| answers_with_data(o.opcode))
            .count();
        // Requests wait, in post order, behind a fence on earlier reads and atomics, and
        // behind the QP's limit of reads and atomics in flight (its max_rd_atomic, the EP's
        // max_rdma_read_out), as an RDMA NIC holds them.
        if !e.fenced.is_empty()
            || (wr.fence && reads_out > 0)
            || (answers_with_data(opcode) && reads_out >= reads_allowed(&e.cap))
        {
            e.close_lane();
            e.fenced.push_back(wr);
            return Ok(());
        }
        self.start_send(sh, qp, wr);
        Ok(())
    }

    /// Starts requests that waited behind a fence or the read limit, in order, as far as the
    /// fences and the limit allow.
    pub(super) fn start_fenced(&mut self, sh: &Shared, qp: u32) {
        loop {
            let Some(e) = self.qps.get_mut(&qp) else {
                return;
            };
            if e.state != QpState::Connected {
                return;
            }
            let reads_out = e
                .outstanding
                .iter()
                .filter(|o| answers_with_data(o.opcode))
                .count();
            let blocked = match e.fenced.front() {
                None => return,
                Some(w) => {
                    (w.fence && reads_out > 0)
                        || (answers_with_data(w.op.opcode()) && reads_out >= reads_allowed(&e.cap))
                }
            };
            if blocked {
                return;
            }
            let Some(wr) = e.fenced.pop_front() else {
                return;
            };
            self.start_send(sh, qp, wr);
        }
    }

    /// Executes a request on a connected QP: gathers its data now and queues its frame, or
    /// applies a bind; it joins the outstanding requests, which complete in order.
    pub(super) fn start_send(&mut self, sh: &Shared, qp: u32, wr: SendWr) {
        if self.try_same_host(sh, qp, &wr) || self.try_same_host_send(sh, qp, &wr) {
            return;
        }
        let consumes_recv = matches!(
            wr.op,
            SendOp::Send | SendOp::SendInv { .. } | SendOp::RdmaWriteImm { .. }
        );
        let Some(e) = self.qps.get_mut(&qp) else {
            return;
        };
        let Some(token) = e.conn else {
            return;
        };
        let pd = e.pd;
        let seq = e.next_seq;
        e.next_seq += 1;
        let mut o = Outstanding {
            wr_id: wr.wr_id,
            ctx: wr.ctx,
            opcode: wr.op.opcode(),
            len: 0,
            seq,
            read_sgl: Vec::new(),
            local: None,
        };
        let built = {
            let mut keys = sh.keys.write();
            Request::new(sh, &wr, pd, seq, &mut o).build(&mut keys)
        };
        let frame = match built {
            Ok(frame) => frame,
            Err(status) => {
                // A local error completes the request and breaks the connection, as on a NIC.
                self.complete(qp, &o, status);
                self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
                return;
            }
        };
        if let Some(e) = self.qps.get_mut(&qp) {
            // Requests after this one complete after it: they wait for the engine (lane.rs).
            e.close_lane();
            e.outstanding.push_back(o);
            if consumes_recv {
                e.sent_to_recvs += 1;
            }
        }
        match frame {
            Some((h, payload)) => {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.out.push_frame(h, payload);
                }
                self.try_write(token);
            }
            None => self.complete_local_heads(qp),
        }
    }

    pub(crate) fn post_recv(&mut self, sh: &Shared, qp: u32, wr: RecvWr) -> Result<()> {
        self.note_poster(qp);
        let e = self.qps.get_mut(&qp).ok_or_else(bad_state)?;
        if e.srq.is_some() {
            return Err(bad_state());
        }
        if e.state == QpState::Error {
            let cq = e.recv_cq.clone();
            self.push_wc(&cq, wr.flushed(qp));
            return Ok(());
        }
        if wr.sgl.len() > e.cap.max_recv_sge.max(1) as usize {
            return Err(Error::TooLong);
        }
        if e.rq.len() >= e.cap.max_recv_wr as usize {
            return Err(Error::NoResource(Resource::WorkQueue));
        }
        e.rq.push_back(wr);
        let conn = e.conn;
        self.publish_recvs(qp);
        if let Some(t) = conn {
            self.retry_held(sh, t);
        }
        Ok(())
    }

    pub(crate) fn retry_held_for_srq(&mut self, sh: &Shared, srq: u64) {
        let tokens: Vec<u64> = self
            .qps
            .values()
            .filter(|e| e.srq.as_ref().map(|s| s.id == srq).unwrap_or(false))
            .filter_map(|e| e.conn)
            .collect();
        for t in tokens {
            self.retry_held(sh, t);
        }
    }

    /// Runs the requests held on connections whose output has drained (see `try_write`).
    pub(crate) fn retry_drained(&mut self, sh: &Shared) {
        // Retrying may drain the output again (until the socket is full or nothing is held).
        while !self.drained.is_empty() {
            for token in std::mem::take(&mut self.drained) {
                self.retry_held(sh, token);
            }
        }
    }

    /// Tries again the requests queued behind a send that had no receive, or behind an RDMA
    /// read that waited for our output to drain.
    pub(super) fn retry_held(&mut self, sh: &Shared, token: u64) {
        let Some(c) = self.conns.get(&token) else {
            return;
        };
        if c.held.is_empty() {
            // Nothing waits (the common case, on every receive posted): nothing to retry, no
            // frame left undecoded behind a held one and no reading to resume, so no need to
            // wake the progress thread either (that was a wake-up per message).
            return;
        }
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            let Phase::Established { qp } = c.phase else {
                return;
            };
            let Some((h, p)) = c.held.pop_front() else {
                break;
            };
            c.held_bytes = c.held_bytes.saturating_sub(held_cost(p.len()));
            c.recharge();
            match self.target_request(sh, token, qp, &h, &p) {
                Outcome::Done => {}
                Outcome::Hold => {
                    if let Some(c) = self.conns.get_mut(&token) {
                        c.held_bytes += held_cost(p.len());
                        c.held.push_front((h, p));
                    }
                    // It may wait for the answers just queued to drain: send them now.
                    self.try_write(token);
                    self.wake_needed = true;
                    return;
                }
                Outcome::Broken => return,
            }
        }
        // All received: a peer that ended meanwhile is reported now.
        if let Some(how) = self.conns.get(&token).and_then(|c| c.peer_end) {
            self.report_peer_end(token, how);
            return;
        }
        // Frames decoded but not processed while holding, and reading resumes.
        self.process_frames(sh, token);
        self.wake_needed = true;
    }

    /// An ACK or READ_RESP for our oldest outstanding request.
    /// `placed`: the payload of a READ_RESP was already placed (by a `ReadSink`), with
    /// this outcome.
    pub(super) fn response(
        &mut self,
        sh: &Shared,
        qp: u32,
        h: &Header,
        p: &[u8],
        placed: Option<WcStatus>,
    ) {
        let Some(e) = self.qps.get_mut(&qp) else {
            return;
        };
        let pd = e.pd;
        let matches = match e.outstanding.front() {
            Some(o) => {
                o.local.is_none()
                    && o.seq == h.seq
                    && (h.kind == Kind::ReadResp) == answers_with_data(o.opcode)
            }
            None => false,
        };
        if !matches {
            log::warn!("qp {qp}: response does not match the oldest request; breaking");
            self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
            return;
        }
        let Some(o) = e.outstanding.pop_front() else {
            return;
        };
        let status = match h.status {
            Status::Ok => {
                if let Some(status) = placed {
                    status
                } else if h.kind == Kind::ReadResp {
                    if p.len() != o.len as usize {
                        WcStatus::BadResponse
                    } else {
                        match sh.keys.read().scatter(&o.read_sgl, pd, p) {
                            Ok(()) => WcStatus::Success,
                            Err(s) => s,
                        }
                    }
                } else {
                    WcStatus::Success
                }
            }
            Status::RemoteAccess => WcStatus::RemoteAccess,
            Status::RemoteLength | Status::RemoteInvalid => WcStatus::RemoteInvalidRequest,
            Status::BadVersion => WcStatus::BadResponse,
        };
        self.complete(qp, &o, status);
        if status != WcStatus::Success {
            self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
            return;
        }
        if answers_with_data(o.opcode) {
            self.start_fenced(sh, qp);
        }
        self.complete_local_heads(qp);
    }
}

/// A request being started (`Engine::start_send`): what its frame says, built from the work
/// request under the key registry's lock, and what its outstanding entry `o` records.
struct Request<'a> {
    sh: &'a Shared,
    wr: &'a SendWr,
    pd: u32,
    seq: u64,
    o: &'a mut Outstanding,
}

/// A request's frame: its header and payload.
type Frame = (Header, Vec<u8>);

impl<'a> Request<'a> {
    #[inline]
    fn new(
        sh: &'a Shared,
        wr: &'a SendWr,
        pd: u32,
        seq: u64,
        o: &'a mut Outstanding,
    ) -> Request<'a> {
        Request { sh, wr, pd, seq, o }
    }

    /// The request's frame (None for a bind, applied here), or the local error that fails it.
    #[inline]
    fn build(self, keys: &mut Keys) -> std::result::Result<Option<Frame>, WcStatus> {
        match self.wr.op {
            SendOp::Send | SendOp::SendInv { .. } => self.gathered(keys, Kind::Send).map(Some),
            SendOp::RdmaWrite { .. } => self.gathered(keys, Kind::Write).map(Some),
            SendOp::RdmaWriteImm { .. } => self.gathered(keys, Kind::WriteImm).map(Some),
            SendOp::FetchAdd { .. } | SendOp::CmpSwap { .. } => self.atomic(keys).map(Some),
            SendOp::RdmaRead { remote_addr, rkey } => self.read(keys, remote_addr, rkey).map(Some),
            SendOp::BindMw { .. } => {
                self.bind(keys);
                Ok(None)
            }
        }
    }

    #[inline]
    fn header(&self, kind: Kind) -> Header {
        let mut h = Header::new(kind);
        h.seq = self.seq;
        h
    }

    /// A SEND, WRITE or WRITE_IMM: its data gathered from local memory now.
    #[inline]
    fn gathered(self, keys: &Keys, kind: Kind) -> std::result::Result<Frame, WcStatus> {
        let data = keys.gather(&self.wr.sgl, self.pd)?;
        let mut h = self.header(kind);
        match self.wr.op {
            SendOp::SendInv { rkey } => {
                h.flags = wire::FLAG_INVALIDATE;
                h.key = rkey;
            }
            SendOp::RdmaWrite { remote_addr, rkey } => {
                h.addr = remote_addr;
                h.key = rkey;
            }
            SendOp::RdmaWriteImm {
                remote_addr,
                rkey,
                imm,
            } => {
                h.addr = remote_addr;
                h.key = rkey;
                h.length = imm;
            }
            _ => {}
        }
        if self.wr.solicited && kind != Kind::Write {
            h.flags |= wire::FLAG_SOLICITED;
        }
        self.o.len = data.len() as u32;
        Ok((h, data))
    }

    /// A fetch-and-add or compare-and-swap: the previous value lands in one 8-byte local
    /// segment.
    fn atomic(self, keys: &Keys) -> std::result::Result<Frame, WcStatus> {
        let total = keys.check_local_sgl(&self.wr.sgl, self.pd, true)?;
        if total != 8 {
            return Err(WcStatus::LocalLength);
        }
        let (remote_addr, rkey, flag, operand, swap) = match self.wr.op {
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => (remote_addr, rkey, wire::FLAG_FETCH_ADD, add, 0),
            SendOp::CmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => (remote_addr, rkey, wire::FLAG_CMP_SWAP, compare, swap),
            _ => unreachable!("an atomic request"),
        };
        let mut h = self.header(Kind::Atomic);
        h.addr = remote_addr;
        h.key = rkey;
        h.flags = flag;
        let mut payload = Vec::with_capacity(16);
        payload.extend_from_slice(&operand.to_le_bytes());
        payload.extend_from_slice(&swap.to_le_bytes());
        self.o.len = 8;
        self.o.read_sgl = self.wr.sgl.to_vec();
        Ok((h, payload))
    }

    /// An RDMA read: its local segments checked now, filled when the answer comes.
    #[inline]
    fn read(
        self,
        keys: &Keys,
        remote_addr: u64,
        rkey: u32,
    ) -> std::result::Result<Frame, WcStatus> {
        let total = keys.check_local_sgl(&self.wr.sgl, self.pd, true)?;
        if total > u64::from(self.sh.limits.max_message) {
            return Err(WcStatus::LocalLength);
        }
        let mut h = self.header(Kind::ReadReq);
        h.addr = remote_addr;
        h.key = rkey;
        h.length = total as u32;
        self.o.len = total as u32;
        self.o.read_sgl = self.wr.sgl.to_vec();
        Ok((h, Vec::new()))
    }

    /// A memory-window bind, applied now (in QP order); it completes in order as a local
    /// operation.
    fn bind(self, keys: &mut Keys) {
        let SendOp::BindMw {
            mw: _,
            ref mr,
            addr,
            length,
            access,
            new_rkey,
        } = self.wr.op
        else {
            unreachable!("a bind request")
        };
        let window = self
            .sh
            .mws
            .lock()
            .get(&(new_rkey >> 8))
            .and_then(|w| w.upgrade());
        let ok = match window {
            Some(w) => w.apply_bind(
                keys,
                mr.as_ref().map(|m| m.lkey()),
                addr,
                length,
                access,
                new_rkey,
            ),
            None => false,
        };
        self.o.local = Some(if ok {
            WcStatus::Success
        } else {
            WcStatus::MwBind
        });
    }
}
