//! A provider completion handed to its QP (a request, a receive, a bounce
//! buffer, a key lookup, the farewell), the peer's receipts read, and what
//! the progress thread tries again for the QP.

use super::*;

impl OfiQp {
    /// A provider completion (or error) of slot `token`. Returns whether the
    /// connection broke under it (the caller calls `broken` once it holds no
    /// queue lock).
    pub(crate) fn completed(
        &self,
        token: u32,
        result: Result<u32, WcStatus>,
        data: Option<u64>,
        out: &mut VecDeque<WorkCompletion>,
    ) -> bool {
        // Over reliable datagrams no connection drops under a failed request
        // (a stale key, say): as on an RDMA NIC any failed request breaks it.
        let fatal = matches!(
            result,
            Err(WcStatus::RemoteAccess
                | WcStatus::RemoteInvalidRequest
                | WcStatus::Transport
                | WcStatus::RemoteOp)
        ) || (self.rdm && result.is_err() && token & RECV_BIT == 0)
            // A message longer than its receive: as on an RDMA NIC the
            // receive fails and the connection breaks (the sender's message
            // then never counts as received: `Ring::flush`).
            || (self.rdm && token & RECV_BIT != 0 && result == Err(WcStatus::LocalLength));
        if token == FAREWELL_TOKEN {
            // The connection ends next either way.
            self.farewell_done.store(true, Ordering::Release);
            return false;
        }
        let mut inner = self.inner.lock();
        let mut token = token;
        if token != LOOKUP_TOKEN && token & (RECV_BIT | WRITE_PART) == WRITE_PART {
            inner.sends_given = inner.sends_given.saturating_sub(1);
            if result.is_ok() {
                // Its send completes the request (or did, failing at post),
                // or goes now if it waited for the write (`issue`).
                let base = token & !WRITE_PART;
                if let Some(slot) = inner.sends.get_mut(base) {
                    if let Some(imm) = slot.closing_imm.take() {
                        let len = slot.len as u64;
                        self.close_write_imm(&mut inner, base, len, imm);
                    }
                }
                inner.sends.release(out);
                self.release_held(&mut inner, out);
                return false;
            }
            // Its failure is the request's.
            token &= !WRITE_PART;
        }
        if token == LOOKUP_TOKEN {
            // Not the consumer's: the requests waiting for the entry go on. A
            // lookup fails only as its connection ends: they wait for the flush.
            self.looked_up(&mut inner, result.is_ok());
            if result.is_ok() {
                self.release_held(&mut inner, out);
            }
            inner.broke |= fatal;
            let refused = std::mem::take(&mut inner.break_pending);
            return (fatal || refused) && inner.state == QpState::Connected;
        }
        // libfabric fails every request outstanding when a connection ends; as
        // on an RDMA NIC, only the first error is the QP's, what follows it (and
        // a receive, which sees no transport) is flushed.
        let result = match result {
            Err(WcStatus::LocalLength) => result,
            // soft-RoCE fails a receive too small for its message as a local
            // QP operation error (the sender sees REM_OP_ERR), not LOC_LEN_ERR;
            // the core checked the receive's own segments before the post, so
            // a message longer than them is the cause left.
            Err(WcStatus::LocalQpOp) if !inner.broke && token & RECV_BIT != 0 => {
                Err(WcStatus::LocalLength)
            }
            Err(_) if inner.broke || token & RECV_BIT != 0 => Err(WcStatus::Flushed),
            _ => result,
        };
        inner.broke |= fatal;
        if token & BOUNCE == BOUNCE {
            let slot = (token & TOKEN_MASK) as usize;
            self.bounce_landed(&mut inner, Landed { slot, result, data }, out);
        } else if token & RECV_BIT != 0 {
            self.received(&mut inner, token, result, data, out);
        } else {
            inner.sends_given = inner.sends_given.saturating_sub(1);
            if inner.segmented == Some(token) {
                inner.segmented = None;
            }
            let num = self.num;
            inner.sends.mark(token, |s| match result {
                Ok(_) => WorkCompletion::new(s.wr_id, WcStatus::Success, s.opcode, s.len, num),
                Err(status) => WorkCompletion::new(s.wr_id, status, s.opcode, 0, num),
            });
            inner.sends.release(out);
            self.release_held(&mut inner, out);
        }
        let refused = std::mem::take(&mut inner.break_pending);
        (fatal || refused) && inner.state == QpState::Connected
    }

    /// Reads our receipt words: the sends the peer's receipt covers complete,
    /// in order, into `out` (the request CQ's queue, its lock held by the
    /// caller). Returns whether the connection is to break (as `completed`).
    /// Once nothing awaits a receipt, the request CQ stops looking
    /// (`awaits_receipts`).
    pub(crate) fn take_receipt(&self, out: &mut VecDeque<WorkCompletion>) -> bool {
        let mut inner = self.inner.lock();
        let count = self.farewell.receipt();
        if count > inner.sends.received {
            inner.sends.received = count;
            inner.sends.release(out);
            self.release_held(&mut inner, out);
        }
        if inner.sends.received >= inner.messages || inner.state == QpState::Error {
            self.awaiting_receipts.store(false, Ordering::Release);
        }
        let refused = std::mem::take(&mut inner.break_pending);
        refused && inner.state == QpState::Connected
    }

    /// Whether sends of ours wait for the peer's receipt.
    pub(crate) fn awaits_receipts(&self) -> bool {
        self.awaiting_receipts.load(Ordering::Acquire)
    }

    /// Posts the held requests again (the provider was busy: `retry_later`),
    /// and bounce buffers it refused.
    pub(crate) fn retry_held(&self) {
        self.send_cq.deliver(|out| {
            let mut inner = self.inner.lock();
            if inner.state == QpState::Connected {
                for (token, len, imm) in std::mem::take(&mut inner.unclosed) {
                    self.close_write_imm(&mut inner, token, len, imm);
                }
                inner.sends.release(out);
                self.release_held(&mut inner, out);
            }
            if matches!(inner.state, QpState::Connected | QpState::Connecting) {
                // Receives that waited for room in the port (or a busy provider).
                let _ = self.feed_recvs(&mut inner);
            }
            let open = matches!(inner.state, QpState::Connected | QpState::Connecting);
            if let (Some(srq), Some(dev), true) = (self.pooled_srq(), self.dev.upgrade(), open) {
                let _ = self.post_bounces(&dev, srq, &mut inner);
            }
        });
        self.match_waiting();
        self.send_receipt();
        if std::mem::take(&mut self.inner.lock().break_pending) {
            self.broken();
        }
    }
}
