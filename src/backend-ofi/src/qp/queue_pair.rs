//! The backend's `QueuePair` over a QP: posting entry points and reset.

use super::*;

impl QueuePair for OfiQp {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn qp_num(&self) -> u32 {
        self.num
    }

    fn state(&self) -> QpState {
        self.inner.lock().state
    }

    fn post_send(&self, wr: &SendWr) -> Result<()> {
        if wr.sgl.len() > self.cap.max_send_sge.max(1) as usize {
            return Err(Error::TooLong);
        }
        self.waiter.note_post();
        if self.state() == QpState::Connected && !self.send_room(&self.inner.lock()) {
            return Err(Error::NoResource(Resource::WorkQueue));
        }
        if matches!(
            wr.op,
            SendOp::BindMw { .. }
                | SendOp::RdmaWrite { .. }
                | SendOp::RdmaRead { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::CmpSwap { .. }
        ) {
            // A bind, or a request whose key lookup fails, may complete right
            // here: the CQ's queue is taken before the QP's lock, as the reaper
            // does, so nothing the provider completes after it is queued before it.
            let posted = self.send_cq.deliver(|q| self.post_locked(wr, q));
            if std::mem::take(&mut self.inner.lock().break_pending) {
                self.broken();
            }
            return posted;
        }
        let mut out = VecDeque::new();
        let posted = self.post_locked(wr, &mut out);
        self.send_cq.push(out);
        posted
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        if wr.sgl.len() > self.cap.max_recv_sge.max(1) as usize {
            return Err(Error::TooLong);
        }
        let mut inner = self.inner.lock();
        if inner.state != QpState::Init {
            // A receive of an EP not connected yet moves nothing: the
            // progress thread keeps its pace (many EPs readied before their
            // connections are made cost it no quick turns).
            self.waiter.note_post();
        }
        if inner.state == QpState::Error {
            drop(inner);
            self.recv_cq.push([wr.flushed(self.num)]);
            return Ok(());
        }
        if inner.recvs.slots.len() >= self.cap.max_recv_wr.max(1) as usize {
            return Err(Error::NoResource(Resource::WorkQueue));
        }
        let token = inner.recvs.push(Slot {
            wr_id: wr.wr_id,
            ctx: wr.ctx,
            opcode: WcOpcode::Recv,
            len: 0,
            done: None,
            closing_imm: None,
            operands: None,
            receipt: None,
        });
        if Self::receives_eagerly(&inner) {
            // Fed from the port's eager buffers: it takes what arrived, if
            // anything did (with the receive CQ's queue, taken first).
            inner.pending.push_back((token, wr));
            let waiting = !inner.arrived.is_empty();
            drop(inner);
            if waiting {
                self.match_waiting();
            }
            return Ok(());
        }
        if Self::ep_of(&inner).is_none() || !inner.pending.is_empty() || !self.may_give_recv(&inner)
        {
            inner.pending.push_back((token, wr));
            return Ok(());
        }
        match self.give_recv(&mut inner, token, &wr) {
            Ok(()) => Ok(()),
            Err(Error::NoResource(Resource::WorkQueue)) if self.rdm => {
                // The port's provider is busy: posted by the progress thread.
                inner.pending.push_back((token, wr));
                Ok(())
            }
            Err(e) => {
                inner.recvs.slots.pop_back();
                Err(e)
            }
        }
    }

    fn reset(&self) -> Result<()> {
        let dev = self.dev.upgrade();
        let _closing = dev.as_ref().map(|d| d.closing.lock());
        let mut inner = self.inner.lock();
        if !matches!(inner.state, QpState::Error | QpState::Init) {
            return Err(Error::BadState);
        }
        close_endpoint(
            &self.dev,
            &self.registry,
            &mut inner,
            self.conn.load(Ordering::Acquire),
        );
        self.end_link(false);
        inner.feeds = Feeds::default();
        inner.state = QpState::Init;
        inner.ended = false;
        inner.broke = false;
        inner.break_pending = false;
        // The endpoint that was reading a key table entry is closed.
        inner.lookup = None;
        Ok(())
    }

    fn posted_recvs(&self) -> u32 {
        self.inner.lock().recvs.slots.len() as u32
    }

    fn local_addr(&self) -> Option<SocketAddrV4> {
        self.inner.lock().local
    }

    fn remote_addr(&self) -> Option<SocketAddrV4> {
        self.inner.lock().remote
    }

    fn destroy(&self) {
        self.destroy_now();
    }
}
