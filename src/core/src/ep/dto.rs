//! The EP's data-transfer calls (dat_ep_post_send, _post_rdma_write, _post_rdma_read,
//! _post_recv and their checks, the receive watermarks): each becomes a work request on the
//! EP's backend queue pair, tracked until its completion (`PendingDto`).

use super::*;

impl Ep {
    /// UNSIGNALLED is allowed only if the EP was configured for it.
    pub(crate) fn check_request_flags(&self, flags: u32) -> DatResult<()> {
        Self::request_flags_allowed(&self.inner.lock(), flags)
    }

    fn request_flags_allowed(i: &EpInner, flags: u32) -> DatResult<()> {
        if flags & completion_flags::UNSIGNALLED != 0
            && i.attr.request_completion_flags & completion_flags::UNSIGNALLED == 0
        {
            return Err(DatError::bad(Param::CompletionFlags));
        }
        Ok(())
    }

    /// Requests are valid in CONNECTED and DISCONNECTED (where they are flushed). A datagram
    /// EP takes none of them (sends name their destination, `post_send_ud`; RDMA, atomics and
    /// binds need a connection): DAT_INVALID_PARAMETER for the EP argument.
    pub(crate) fn check_request_state(&self) -> DatResult<()> {
        Self::request_state_allowed(&self.inner.lock())
    }

    fn request_state_allowed(i: &EpInner) -> DatResult<()> {
        if i.attr.service_type == crate::consts::ib_ext::SERVICE_TYPE_UD {
            return Err(DatError::bad(Param::EpHandle));
        }
        match i.state {
            EpState::Connected | EpState::Disconnected => Ok(()),
            s => Err(state_error(s)),
        }
    }

    /// Posts a send, RDMA write or RDMA read on `qp` (the EP's, from `request_common`): its
    /// record rides in the request's context (`Carried`), which the backend hands back in the
    /// completion; the wr_id is the EP's next number. The request is the caller's, built in
    /// place and handed down by reference. Inlined into each post: as a call of its own its
    /// entry and exit cost a same-host write 30 instructions.
    #[inline(always)]
    pub(crate) fn post_carried(
        &self,
        qp: Arc<dyn QueuePair>,
        wr: &mut SendWr,
        record: Carried,
    ) -> DatResult<()> {
        wr.ctx = record.ctx();
        wr.wr_id = carried_wr_id(self.carried_seq.fetch_add(1, Ordering::Relaxed));
        // The backend refuses the segments of the request.
        qp.post_send(wr)
            .map_err(|e| from_backend(e, Some(Param::NumSegments)))
    }

    /// Posts a send-queue request whose record holds more than `Carried` (a bind, an extended
    /// request) on `qp` (the EP's, or None to look it up): the record waits in the IA's table
    /// by wr_id.
    pub(crate) fn post_tracked(
        &self,
        qp: Option<Arc<dyn QueuePair>>,
        wr: &mut SendWr,
        pending: PendingDto,
    ) -> DatResult<()> {
        let qp = qp
            .or_else(|| self.qp())
            .ok_or(DatError::invalid_state(SubType::EpUnconfigured))?;
        let wr_id = self.ia.track(self.handle, pending)?;
        wr.wr_id = wr_id;
        if let Err(e) = qp.post_send(wr) {
            self.ia.untrack(wr_id);
            // The backend refuses the segments of the request.
            return Err(from_backend(e, Some(Param::NumSegments)));
        }
        Ok(())
    }

    pub(crate) fn request_common(
        &self,
        flags: u32,
        num_segments: usize,
        max_iov: impl Fn(&EpAttr) -> u32,
    ) -> DatResult<(usize, Arc<dyn QueuePair>)> {
        let known = completion_flags::SUPPRESS
            | completion_flags::SOLICITED_WAIT
            | completion_flags::UNSIGNALLED
            | completion_flags::BARRIER_FENCE
            | completion_flags::EVD_THRESHOLD;
        if flags & !known != 0 {
            return Err(DatError::bad(Param::CompletionFlags));
        }
        // One look at the EP (a lock taken once on the post path).
        let i = self.inner.lock();
        Self::request_flags_allowed(&i, flags)?;
        Self::request_state_allowed(&i)?;
        let pz =
            i.pz.as_ref()
                .map(|p| Arc::as_ptr(p) as usize)
                .ok_or(DatError::invalid_state(SubType::EpUnconfigured))?;
        if num_segments > max_iov(&i.attr) as usize {
            return Err(DatError::bad(Param::NumSegments));
        }
        let qp =
            i.qp.clone()
                .ok_or(DatError::invalid_state(SubType::EpUnconfigured))?;
        Ok((pz, qp))
    }

    /// Counts a posted request: DCNT_EP_POST_x, and its bytes in DCNT_EP_POST_x_DATA (the
    /// counter after it).
    pub(crate) fn count_post(&self, counter: usize, bytes: u64) {
        self.shared.count(counter, bytes);
    }

    pub(crate) fn report_success(flags: u32) -> bool {
        flags & (completion_flags::SUPPRESS | completion_flags::UNSIGNALLED) == 0
    }

    /// dat_ep_post_send.
    pub fn post_send(&self, iov: &[Sge], cookie: u64, flags: u32) -> DatResult<()> {
        self.post_send_op(iov, cookie, flags, SendOp::Send)
    }

    /// dat_ep_post_send_with_invalidate with invalidation: a send that, once the peer placed it, ends the binding of the peer's RMR
    /// `rmr_context`; the peer's receive completes as DAT_DTO_RECEIVE_WITH_INVALIDATE naming
    /// it. Without invalidation the call is a plain send.
    pub fn post_send_with_invalidate(
        &self,
        iov: &[Sge],
        cookie: u64,
        flags: u32,
        rmr_context: u32,
    ) -> DatResult<()> {
        self.post_send_op(iov, cookie, flags, SendOp::SendInv { rkey: rmr_context })
    }

    fn post_send_op(&self, iov: &[Sge], cookie: u64, flags: u32, op: SendOp) -> DatResult<()> {
        let (pz, qp) = self.request_common(flags, iov.len(), |a| a.max_request_iov)?;
        let mut wr = SendWr {
            wr_id: 0,
            ctx: WrContext::NONE,
            op,
            sgl: SgeList::new(),
            signaled: Self::report_success(flags),
            solicited: flags & completion_flags::SOLICITED_WAIT != 0,
            fence: flags & completion_flags::BARRIER_FENCE != 0,
        };
        let total = self
            .ia
            .lmrs
            .check_iov_into(pz, iov, mem_priv::LOCAL_READ, &mut wr.sgl)?;
        // Transfers are bounded by the IA's limits; an EP's max_message_size
        // and max_rdma_size are kept and reported but, as in OFED's
        // provider, not enforced (dtest writes 4 MiB through an EP that
        // says 64 KiB).
        if total > u64::from(self.ia.max_msg_size) {
            return Err(DatError::length());
        }
        self.post_carried(
            qp,
            &mut wr,
            Carried {
                ep: self.handle,
                cookie,
                op: dto_op::SEND,
                report_success: Self::report_success(flags),
            },
        )?;
        self.count_post(counters::ep::POST_SEND, total);
        wr.dispose();
        Ok(())
    }

    /// dat_ep_post_rdma_write.
    pub fn post_rdma_write(
        &self,
        iov: &[Sge],
        cookie: u64,
        remote: RemoteBuffer,
        flags: u32,
    ) -> DatResult<()> {
        let (pz, qp) = self.request_common(flags, iov.len(), |a| a.max_rdma_write_iov)?;
        let mut wr = SendWr {
            wr_id: 0,
            ctx: WrContext::NONE,
            op: SendOp::RdmaWrite {
                remote_addr: remote.address,
                rkey: remote.rmr_context,
            },
            sgl: SgeList::new(),
            signaled: Self::report_success(flags),
            solicited: false,
            fence: flags & completion_flags::BARRIER_FENCE != 0,
        };
        let total = self
            .ia
            .lmrs
            .check_iov_into(pz, iov, mem_priv::LOCAL_READ, &mut wr.sgl)?;
        if total > u64::from(self.ia.max_rdma_size) || total > u64::from(remote.length) {
            return Err(DatError::length());
        }
        self.post_carried(
            qp,
            &mut wr,
            Carried {
                ep: self.handle,
                cookie,
                op: dto_op::RDMA_WRITE,
                report_success: Self::report_success(flags),
            },
        )?;
        self.count_post(counters::ep::POST_WRITE, total);
        wr.dispose();
        Ok(())
    }

    /// dat_ep_post_rdma_read: reads `remote.length` bytes, filling the local IOV front to back.
    pub fn post_rdma_read(
        &self,
        iov: &[Sge],
        cookie: u64,
        remote: RemoteBuffer,
        flags: u32,
    ) -> DatResult<()> {
        let (pz, qp) = self.request_common(flags, iov.len(), |a| a.max_rdma_read_iov)?;
        let mut wr = SendWr {
            wr_id: 0,
            ctx: WrContext::NONE,
            op: SendOp::RdmaRead {
                remote_addr: remote.address,
                rkey: remote.rmr_context,
            },
            sgl: SgeList::new(),
            signaled: Self::report_success(flags),
            solicited: false,
            fence: flags & completion_flags::BARRIER_FENCE != 0,
        };
        let total = self
            .ia
            .lmrs
            .check_iov_into(pz, iov, mem_priv::LOCAL_WRITE, &mut wr.sgl)?;
        let want = u64::from(remote.length);
        if want > u64::from(self.ia.max_rdma_size) || total < want {
            return Err(DatError::length());
        }
        if total > want {
            // Only as much of the IOV as the remote buffer fills: front segments completely.
            let mut left = want;
            let mut keep = 0;
            for seg in wr.sgl.iter_mut() {
                if left == 0 {
                    break;
                }
                let take = u64::from(seg.length).min(left);
                seg.length = take as u32;
                left -= take;
                keep += 1;
            }
            wr.sgl.truncate(keep);
        }
        // The device reads into fewer segments than it takes for other requests (siw: one;
        // the IA's max_iov_segments_per_rdma_read says): more would be read into the first
        // alone, so they are refused here.
        if wr.sgl.len() > self.ia.max_rdma_read_sge as usize {
            return Err(DatError::bad(Param::NumSegments));
        }
        self.post_carried(
            qp,
            &mut wr,
            Carried {
                ep: self.handle,
                cookie,
                op: dto_op::RDMA_READ,
                report_success: Self::report_success(flags),
            },
        )?;
        self.count_post(counters::ep::POST_READ, want);
        wr.dispose();
        Ok(())
    }

    /// dat_ep_post_recv. Valid in
    /// every configured state; on a DISCONNECTED EP it is flushed.
    pub fn post_recv(&self, iov: &[Sge], cookie: u64, flags: u32) -> DatResult<()> {
        let known = completion_flags::SUPPRESS
            | completion_flags::UNSIGNALLED
            | completion_flags::EVD_THRESHOLD
            | completion_flags::SOLICITED_WAIT;
        if flags & !known != 0 {
            return Err(DatError::bad(Param::CompletionFlags));
        }
        // One look at the EP: what the post checks, its QP, and whether a watermark is set
        // (with none, the count of Recv buffers is not looked at after the post).
        let (pz, qp, service_type, watermarked) = {
            let i = self.inner.lock();
            if flags & completion_flags::UNSIGNALLED != 0
                && i.attr.recv_completion_flags & completion_flags::UNSIGNALLED == 0
            {
                return Err(DatError::bad(Param::CompletionFlags));
            }
            if i.srq.is_some() {
                return Err(state_error(i.state));
            }
            let pz =
                i.pz.as_ref()
                    .map(|p| Arc::as_ptr(p) as usize)
                    .ok_or(DatError::invalid_state(SubType::EpUnconfigured))?;
            let qp =
                i.qp.clone()
                    .ok_or(DatError::invalid_state(SubType::EpUnconfigured))?;
            if iov.len() > i.attr.max_recv_iov as usize {
                return Err(DatError::bad(Param::NumSegments));
            }
            let w = &i.watermarks;
            let watermarked = w.soft_armed || w.hard.is_some();
            (pz, qp, i.attr.service_type, watermarked)
        };
        let mut sgl = SgeList::new();
        let total = self
            .ia
            .lmrs
            .check_iov_into(pz, iov, mem_priv::LOCAL_WRITE, &mut sgl)?;
        // A datagram EP's receives complete as DAT_IB_DTO_EVENTs (DAT_IB_UD_RECV).
        let (op, ext) = ud::recv_kind(service_type);
        // The receive's record rides in its context (`Received`); the wr_id is the EP's next
        // number, as a carried send's.
        let report = Self::report_success(flags);
        let ctx = Received::ctx(self.shared.clone(), cookie, op, ext, report);
        let wr_id = carried_wr_id(self.carried_seq.fetch_add(1, Ordering::Relaxed));
        if let Err(e) = qp.post_recv(RecvWr { wr_id, ctx, sgl }) {
            // SAFETY: the backend refused the receive: the context is ours again, once.
            drop(unsafe { Received::from_ctx(&ctx) });
            return Err(from_backend(e, Some(Param::NumSegments)));
        }
        self.count_post(counters::ep::POST_RECV, total);
        if watermarked {
            self.check_recv_watermarks();
        }
        Ok(())
    }

    /// dat_ep_recv_query: (nbufs_allocated, bufs_alloc_span): the Recv buffers at the EP
    /// (posted and not completed; see `Watermarks`) and their span, which on our in-order
    /// transports is the same count (DAT: never fewer than the buffers).
    pub fn recv_query(&self) -> DatResult<(i32, i32)> {
        let posted = self.recv_buffers() as i32;
        Ok((posted, posted))
    }

    /// The Recv buffers at the EP (see `Watermarks`).
    fn recv_buffers(&self) -> u32 {
        self.qp().map(|q| q.posted_recvs()).unwrap_or(0)
    }

    /// dat_ep_set_watermark: sets both watermarks and re-arms the
    /// soft one (see `Watermarks`); a count already above either fires during the call. Valid
    /// in every EP state. DAT_WATERMARK_INFINITE (-1) sets none; other negative values are
    /// DAT_INVALID_PARAMETER.
    pub fn set_watermark(&self, soft_high: i32, hard_high: i32) -> DatResult<()> {
        let level = |v: i32, param: Param| match v {
            WATERMARK_INFINITE => Ok(None),
            v => u32::try_from(v).map(Some).map_err(|_| DatError::bad(param)),
        };
        let soft = level(soft_high, Param::SoftHighWatermark)?;
        let hard = level(hard_high, Param::HardHighWatermark)?;
        {
            let mut i = self.inner.lock();
            i.watermarks = Watermarks {
                soft,
                soft_armed: soft.is_some(),
                hard,
                breaking: i.watermarks.breaking,
            };
        }
        self.check_recv_watermarks();
        Ok(())
    }

    /// Fires what the Recv buffers at the EP now exceed (see `Watermarks`). Called with no
    /// lock held: it posts events and may tear the connection down.
    pub(super) fn check_recv_watermarks(&self) {
        let (soft_fires, hard_breaks) = {
            let mut i = self.inner.lock();
            let w = i.watermarks;
            let connected = i.state == EpState::Connected;
            if !(w.soft_armed || (w.hard.is_some() && connected)) {
                return;
            }
            let n = i.qp.as_ref().map(|q| q.posted_recvs()).unwrap_or(0);
            let soft_fires = w.soft_armed && w.soft.is_some_and(|s| n > s);
            if soft_fires {
                i.watermarks.soft_armed = false;
            }
            let hard_breaks = connected && w.hard.is_some_and(|h| n > h);
            if hard_breaks {
                // As dat_ep_disconnect: DISCONNECT_PENDING until the backend reports the
                // teardown (it must have let go of the QP before a reset), then reported as
                // BROKEN (see `on_connection_lost`).
                i.state = EpState::DisconnectPending;
                i.watermarks.breaking = true;
            }
            (soft_fires, hard_breaks.then(|| i.qp.clone()).flatten())
        };
        if soft_fires {
            self.ia.post_async_reason(
                event_number::ASYNC_EP_BROKEN,
                self.handle,
                async_reason::EP_SOFT_HIGH_WATERMARK,
            );
        }
        if let Some(qp) = hard_breaks {
            log::debug!(
                "EP {:?}: Recv buffers above the hard high watermark",
                self.handle
            );
            if let Err(e) = self.ia.device().disconnect(&qp, true) {
                log::warn!("EP {:?}: abrupt disconnect: {e}", self.handle);
                self.on_connection_lost(event_number::CONNECTION_BROKEN, Vec::new());
            }
        }
    }
}
