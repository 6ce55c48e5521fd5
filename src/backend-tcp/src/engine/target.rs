//! The target side of the TCP transport: a peer's SEND, WRITE, WRITE_IMM, READ_REQ and ATOMIC
//! executed against our registered memory, in order, each answered on the connection (and
//! the PLACED frames of a same-host peer, which placed the data itself: engine/samehost.rs).

use super::*;

impl Engine {
    // ---- the wire ------------------------------------------------------------------------------

    pub(super) fn answer(&mut self, token: u64, h: Header, payload: Vec<u8>) {
        // A plain ACK on a signalled connection waits for our next frame (signalled.rs).
        if h.kind == Kind::Ack
            && h.status == Status::Ok
            && payload.is_empty()
            && self.hold_ack(token, &h, true)
        {
            return;
        }
        if let Some(c) = self.conns.get_mut(&token) {
            let bytes = wire::HEADER_LEN + payload.len();
            c.out.push_frame(h, payload);
            c.note_answer(bytes);
        }
    }

    /// Executes a SEND, WRITE or READ_REQ from the peer, in order.
    pub(super) fn target_request(
        &mut self,
        sh: &Shared,
        token: u64,
        qp: u32,
        h: &Header,
        p: &[u8],
    ) -> Outcome {
        #[cfg(test)]
        if h.key != 0 && self.panic_on_rkey == Some(h.key) {
            panic!("injected panic (test): request naming rkey {:#x}", h.key);
        }
        if matches!(h.kind, Kind::ReadReq | Kind::Write | Kind::Atomic) {
            self.requests_served += 1;
        }
        // A peer that does not read our answers gets no more of them: its requests wait (and
        // past HOLD_LIMIT are no longer read) until it has taken them.
        if let Some(c) = self.conns.get_mut(&token) {
            if c.answers_pending() >= MAX_ANSWERS_PENDING {
                c.wait_drain = true;
                return Outcome::Hold;
            }
        }
        let Some(e) = self.qps.get_mut(&qp) else {
            return Outcome::Broken;
        };
        let pd = e.pd;
        match h.kind {
            Kind::Send => {
                let Some((wr, pd, own_rq)) = e.take_receive() else {
                    return Outcome::Hold;
                };
                let placed = sh.keys.read().scatter(&wr.sgl, pd, p);
                self.message_received(sh, token, qp, h, &wr, own_rq, placed, p.len())
            }
            // A write-with-immediate waits for a posted receive, as a send does.
            Kind::WriteImm if !e.has_receive() => Outcome::Hold,
            Kind::WriteImm => self.target_write_imm(sh, token, qp, pd, h, p),
            Kind::Atomic => self.target_atomic(sh, token, qp, pd, h, p),
            Kind::Write => self.write_and_ack(sh, token, qp, pd, h, p),
            Kind::Placed => self.placed(token, qp, h),
            Kind::ReadReq => self.target_read(sh, token, qp, pd, h),
            _ => Outcome::Broken,
        }
    }

    /// A peer's WRITE_IMM, with a receive posted for it: the data goes where the rkey says,
    /// then the receive reports its arrival with the immediate data.
    fn target_write_imm(
        &mut self,
        sh: &Shared,
        token: u64,
        qp: u32,
        pd: u32,
        h: &Header,
        p: &[u8],
    ) -> Outcome {
        if let Outcome::Broken = self.write_and_ack(sh, token, qp, pd, h, p) {
            return Outcome::Broken;
        }
        let Some(e) = self.qps.get_mut(&qp) else {
            return Outcome::Broken;
        };
        let rcq = e.recv_cq.clone();
        if let Some((wr, _, own_rq)) = e.take_receive() {
            if own_rq {
                self.recv_consumed(qp);
            }
            self.push_wc(
                &rcq,
                WorkCompletion {
                    imm: Some(h.length),
                    solicited: h.flags & wire::FLAG_SOLICITED != 0,
                    ..wr.completion(WcStatus::Success, WcOpcode::RecvRdmaImm, p.len() as u32, qp)
                },
            );
        }
        Outcome::Done
    }

    /// A peer's ATOMIC: applied to our memory, the previous value answered.
    fn target_atomic(
        &mut self,
        sh: &Shared,
        token: u64,
        qp: u32,
        pd: u32,
        h: &Header,
        p: &[u8],
    ) -> Outcome {
        let mut operands = [0u64; 2];
        for (i, w) in p.chunks_exact(8).take(2).enumerate() {
            operands[i] = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        }
        let r = match h.flags {
            wire::FLAG_FETCH_ADD if p.len() == 16 => {
                sh.keys
                    .read()
                    .remote_atomic(h.key, h.addr, pd, operands[0], None)
            }
            wire::FLAG_CMP_SWAP if p.len() == 16 => {
                sh.keys
                    .read()
                    .remote_atomic(h.key, h.addr, pd, operands[0], Some(operands[1]))
            }
            _ => Err(Status::RemoteInvalid),
        };
        let mut resp = Header::new(Kind::ReadResp);
        resp.seq = h.seq;
        match r {
            Ok(old) => {
                self.answer(token, resp, old.to_le_bytes().to_vec());
                Outcome::Done
            }
            Err(s) => self.refuse(token, qp, resp, s, "remote atomic", h.key),
        }
    }

    /// Answers request `resp` (of `what`, naming `rkey`) with refusal `status`, and breaks
    /// the connection once the answer is out.
    fn refuse(
        &mut self,
        token: u64,
        qp: u32,
        mut resp: Header,
        status: Status,
        what: &str,
        rkey: u32,
    ) -> Outcome {
        log::info!("qp {qp}: {what} refused (rkey {rkey:#x})");
        resp.status = status;
        self.answer(token, resp, Vec::new());
        self.break_after_answer(token, qp);
        Outcome::Broken
    }

    /// A peer's READ_REQ: answered from our memory, straight into the socket when nothing is
    /// queued before it.
    fn target_read(&mut self, sh: &Shared, token: u64, qp: u32, pd: u32, h: &Header) -> Outcome {
        // An answer is sent straight from the registered memory when nothing is queued
        // before it; so while answers are queued, later reads wait (their requests are
        // held, in order) instead of being copied into the queue. `try_write` resumes
        // them once the queue has drained into the socket.
        if let Some(c) = self.conns.get_mut(&token) {
            if !c.out.is_empty() {
                c.wait_drain = true;
                return Outcome::Hold;
            }
        }
        let mut resp = Header::new(Kind::ReadResp);
        resp.seq = h.seq;
        // With nothing queued before it, the answer goes out straight from the
        // registered memory (one copy fewer); what the socket does not take is queued.
        let direct = self
            .conns
            .get(&token)
            .filter(|c| {
                c.out.is_empty()
                    && !c.write_failed
                    && !c.is_closing()
                    && c.same_host.outgoing.is_none()
            })
            .map(|c| c.stream.as_raw_fd());
        let r = match direct {
            Some(fd) => match self.read_answer_to_socket(sh, token, pd, h, resp, fd) {
                Some(r) => r,
                None => {
                    // Part of an answer is out and the rest of the memory gone.
                    log::warn!("qp {qp}: memory of a remote read unmapped while answered");
                    self.conn_lost(token);
                    return Outcome::Broken;
                }
            },
            None => sh
                .keys
                .read()
                .remote_read(h.key, h.addr, h.length, pd)
                .map(|data| self.answer(token, resp, data)),
        };
        match r {
            Ok(()) => Outcome::Done,
            Err(s) => self.refuse(token, qp, resp, s, "remote read", h.key),
        }
    }

    /// Sends the answer `resp` to READ_REQ `h` from our memory straight into socket `fd`,
    /// queueing what the socket does not take. None: part of it is out and the rest of the
    /// memory gone.
    #[inline]
    fn read_answer_to_socket(
        &mut self,
        sh: &Shared,
        token: u64,
        pd: u32,
        h: &Header,
        resp: Header,
        fd: std::os::fd::RawFd,
    ) -> Option<std::result::Result<(), Status>> {
        let mut full = resp;
        full.payload_len = h.length;
        let head = full.encode();
        let sent = sh
            .keys
            .read()
            .remote_read_to_socket(h.key, h.addr, h.length, pd, fd, &head);
        match sent {
            Ok((sent, rest)) => {
                if let Some(c) = self.conns.get_mut(&token) {
                    let bytes = head.len().saturating_sub(sent) + rest.len();
                    if sent < head.len() {
                        c.out.push_bytes(head[sent..].to_vec());
                    }
                    c.out.push_bytes(rest);
                    c.note_answer(bytes);
                }
                Some(Ok(()))
            }
            Err(Some(status)) => Some(Err(status)),
            Err(None) => None,
        }
    }

    /// A peer's SEND `h` is in receive `recv` (taken from the QP's own queue if `own_rq`), or
    /// failed to go in (`placed`): the receive completes, and the peer learns the outcome
    /// (ACK); a failure then breaks the connection. A send-with-invalidate ends the binding
    /// of one of our windows (of this QP's PD) once its message is placed; a key that names
    /// none fails the receive, as an RDMA NIC fails it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn message_received(
        &mut self,
        sh: &Shared,
        token: u64,
        qp: u32,
        h: &Header,
        recv: &RecvWr,
        own_rq: bool,
        placed: Result<(), WcStatus>,
        len: usize,
    ) -> Outcome {
        let Some(e) = self.qps.get(&qp) else {
            return Outcome::Broken;
        };
        let (rcq, qp_pd) = (e.recv_cq.clone(), e.pd);
        let mut invalidated = None;
        let status = match placed {
            Err(s) => s,
            Ok(()) if h.flags & wire::FLAG_INVALIDATE != 0 => {
                let mut keys = sh.keys.write();
                let window = sh.mws.lock().get(&(h.key >> 8)).and_then(|w| w.upgrade());
                match window {
                    Some(w) if w.remote_invalidate(&mut keys, h.key, qp_pd) => {
                        invalidated = Some(h.key);
                        WcStatus::Success
                    }
                    _ => WcStatus::LocalProtection,
                }
            }
            Ok(()) => WcStatus::Success,
        };
        self.push_wc(
            &rcq,
            WorkCompletion {
                invalidated,
                solicited: h.flags & wire::FLAG_SOLICITED != 0,
                ..recv.completion(status, WcOpcode::Recv, len as u32, qp)
            },
        );
        if own_rq {
            self.recv_consumed(qp);
        }
        let mut ack = Header::new(Kind::Ack);
        ack.seq = h.seq;
        ack.status = match status {
            WcStatus::Success => Status::Ok,
            WcStatus::LocalLength => Status::RemoteLength,
            WcStatus::LocalProtection
                if invalidated.is_none() && h.flags & wire::FLAG_INVALIDATE != 0 =>
            {
                Status::RemoteInvalid
            }
            _ => Status::RemoteAccess,
        };
        self.answer(token, ack, Vec::new());
        if status != WcStatus::Success {
            self.break_after_answer(token, qp);
            return Outcome::Broken;
        }
        Outcome::Done
    }

    /// A WRITE's (or WRITE_IMM's) data placed under the rkey the header names, and its ACK;
    /// a refused access is answered, then breaks the connection.
    fn write_and_ack(
        &mut self,
        sh: &Shared,
        token: u64,
        qp: u32,
        pd: u32,
        h: &Header,
        p: &[u8],
    ) -> Outcome {
        let r = sh.keys.read().remote_write(h.key, h.addr, pd, p);
        self.ack_write(token, qp, h, r)
    }

    /// A WRITE's ACK, saying whether its data was placed; a refused access is answered, then
    /// breaks the connection.
    pub(super) fn ack_write(
        &mut self,
        token: u64,
        qp: u32,
        h: &Header,
        r: Result<(), Status>,
    ) -> Outcome {
        let mut ack = Header::new(Kind::Ack);
        ack.seq = h.seq;
        ack.status = match r {
            Ok(()) => Status::Ok,
            Err(s) => s,
        };
        self.answer(token, ack, Vec::new());
        if r.is_err() {
            log::info!("qp {qp}: remote write refused (rkey {:#x})", h.key);
            self.break_after_answer(token, qp);
            return Outcome::Broken;
        }
        Outcome::Done
    }
}
