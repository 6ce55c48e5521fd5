//! The request side of a QP: sends, RDMA reads and writes, atomics and
//! binds posted in order, held behind fences, key lookups and a busy
//! provider, and what the peer's key table entry says of them.

use super::*;

impl OfiQp {
    /// A message was posted (request `token`'s send): where the provider
    /// reports it sent once the peer's NIC has it, whether or not a receive
    /// of the peer took it (`Domain::receipts`), its success waits for
    /// the peer's receipt of it.
    pub(super) fn await_receipt(&self, dev: &Domain, inner: &mut Inner, token: u32) {
        if !dev.receipts {
            return;
        }
        inner.messages += 1;
        let number = inner.messages;
        if let Some(slot) = inner.sends.get_mut(token) {
            slot.receipt = Some(number);
        }
        // The request CQ's reads look at our receipt words from now on.
        if !self.awaiting_receipts.swap(true, Ordering::AcqRel) {
            let me: Weak<dyn Any + Send + Sync> = self.me.clone();
            self.send_cq.await_receipts(me);
        }
    }

    /// Whether the peer's entry of an RDMA request's key refuses it: no such
    /// key, the range outside its memory, a right it lacks, or its memory in
    /// another protection domain than the peer QP's. The provider would drop
    /// the connection without saying why (or, across protection domains,
    /// which it does not have, allow it): the backend fails the request as
    /// the remote access error it is (`keys::Entry`).
    pub(super) fn refused(&self, inner: &Inner, request: &Request) -> bool {
        let (va, rkey, right) = match request.kind {
            Kind::Write { va, rkey, .. } => (va, rkey, daplrs_backend::access::REMOTE_WRITE),
            Kind::Read { va, rkey } => (va, rkey, daplrs_backend::access::REMOTE_READ),
            Kind::Atomic { va, rkey, .. } => (va, rkey, daplrs_backend::access::REMOTE_ATOMIC),
            _ => return false,
        };
        let Some(found) = inner.starts.get(&rkey) else {
            // Not looked up: the provider addresses by virtual address and checks.
            return false;
        };
        let Some(r) = found else { return true };
        let inside = va >= r.start
            && va
                .checked_add(request.len)
                .is_some_and(|end| end <= r.start.saturating_add(r.length));
        let same_pd = inner.peer.pd == 0 || r.pd == inner.peer.pd;
        !inside || r.rights & right == 0 || !same_pd
    }

    /// Whether a request to `rkey` must wait for the peer's table entry.
    /// Where the peer's table is mapped, never: the entry is read there now,
    /// again at every call, so a request issued after this call is checked
    /// against what the entry said when it went (as a fresh lookup is).
    pub(super) fn needs_lookup(&self, inner: &mut Inner, rkey: Option<u32>) -> bool {
        let Some(k) = rkey else {
            return false;
        };
        if let Some(mapped) = inner.peer_keys.as_ref() {
            inner.starts.insert(k, mapped.read(k));
            return false;
        }
        !inner.starts.contains_key(&k)
    }

    /// The lookup in flight completed (`ok`: what the peer's entry says is
    /// cached, None where the peer has no such key) or failed.
    pub(super) fn looked_up(&self, inner: &mut Inner, ok: bool) {
        let Some(rkey) = inner.lookup.take() else {
            return;
        };
        if ok {
            let remote = keys::remote_of(&self.lookup.lock().buf, rkey);
            inner.starts.insert(rkey, remote);
        }
    }

    /// Reads the peer's key table entry for `rkey` (one RDMA read, completed
    /// through the send CQ as LOOKUP_TOKEN), unless a lookup is in flight.
    pub(super) fn start_lookup(&self, inner: &mut Inner, rkey: u32) -> Result<()> {
        if inner.lookup.is_some() {
            return Ok(());
        }
        let ep = Self::ep_of(inner).ok_or(Error::NotConnected)?;
        let dev = self.dev.upgrade().ok_or(Error::NoDevice)?;
        let mut lookup = self.lookup.lock();
        if lookup.mr.is_none() {
            lookup.mr = Some(register_lookup(&dev, &mut lookup.buf)?);
        }
        let mut desc = lookup.mr.as_ref().map_or(null_mut(), |m| {
            // SAFETY: the lookup buffer's registration.
            unsafe { fi::fi_mr_desc(m.ptr()) }
        });
        let iov = libc::iovec {
            iov_base: lookup.buf.as_mut_ptr().cast(),
            iov_len: ENTRY_BYTES,
        };
        let rma = fi::fi_rma_iov {
            addr: keys::KeyTable::remote_slot(inner.peer.address, rkey),
            len: ENTRY_BYTES,
            key: inner.peer.key,
        };
        let msg = fi::fi_msg_rma {
            msg_iov: (&iov as *const libc::iovec).cast(),
            desc: &mut desc,
            iov_count: 1,
            rma_iov: &rma,
            rma_iov_count: 1,
            context: self.context(LOOKUP_TOKEN),
            addr: inner.dest,
            ..Default::default()
        };
        // SAFETY: an enabled endpoint; the buffer is registered, and no other
        // lookup writes it until this one's completion (`inner.lookup`).
        let rc = unsafe { fi::fi_readmsg(ep, &msg, fi::FI_COMPLETION as u64) };
        crate::check(
            rc,
            "fi_readmsg (key lookup)",
            Error::NoResource(Resource::WorkQueue),
        )?;
        inner.lookup = Some(rkey);
        Ok(())
    }

    /// Posts `wr`. A fenced request waits (in `held`, its slot taken) until
    /// every earlier one completed, an RDMA request until the peer's entry of
    /// its key was read, and everything posted after either waits behind it.
    /// A bind issued at once completes here, into `out`.
    pub(super) fn post_request(
        &self,
        inner: &mut Inner,
        wr: &SendWr,
        out: &mut VecDeque<WorkCompletion>,
    ) -> Result<()> {
        let dev = self.dev.upgrade().ok_or(Error::NoDevice)?;
        let kind = Kind::of(wr, &dev)?;
        if !self.send_room(inner) {
            return Err(Error::NoResource(Resource::WorkQueue));
        }
        let len: u64 = wr.sgl.iter().map(|s| s.length as u64).sum();
        let operands = match kind {
            Kind::Atomic { op, .. } => Some(Box::new(op.operands())),
            _ => None,
        };
        let token = inner.sends.push(Slot {
            wr_id: wr.wr_id,
            ctx: wr.ctx,
            opcode: wr.op.opcode(),
            len: len as u32,
            done: None,
            closing_imm: None,
            operands,
            receipt: None,
        });
        let request = Request {
            token,
            kind,
            fence: wr.fence || self.unordered(&dev, inner),
            sgl: wr.sgl.to_vec(),
            len,
        };
        if self.needs_lookup(inner, request.kind.rkey()) {
            inner.held.push_back(request);
            self.release_held(inner, out);
            return Ok(());
        }
        if inner.broke
            || !inner.held.is_empty()
            || inner.segmented.is_some()
            || (request.fence && inner.sends.slots.len() > 1)
            || !self.provider_room(inner, &request.kind)
        {
            inner.held.push_back(request);
            return Ok(());
        }
        match self.issue(inner, &request) {
            Err(Error::NoResource(Resource::WorkQueue)) if dev.rdm => {
                // The provider is busy (ofi_rxm: its connection to the peer
                // is still being made; shm: a large transfer to the peer
                // runs): held, and tried again in order (`retry_busy`).
                inner.held.push_back(request);
                self.retry_busy(&dev, inner);
                Ok(())
            }
            Err(e) => {
                // Not posted: the slot goes (it is the newest).
                inner.sends.slots.pop_back();
                Err(e)
            }
            Ok(done) => {
                self.complete_local(inner, &request, done, out);
                Ok(())
            }
        }
    }

    /// A request the backend executed itself (a bind, a read or write done
    /// inline) completes in order.
    pub(super) fn complete_local(
        &self,
        inner: &mut Inner,
        request: &Request,
        done: Option<WcStatus>,
        out: &mut VecDeque<WorkCompletion>,
    ) {
        let Some(status) = done else { return };
        self.finish_local(inner, request, status, out);
        if status != WcStatus::RemoteAccess {
            self.release_held(inner, out);
        }
    }

    /// Completes a request the backend executed itself with `status`, in order.
    fn finish_local(
        &self,
        inner: &mut Inner,
        request: &Request,
        status: WcStatus,
        out: &mut VecDeque<WorkCompletion>,
    ) {
        if status == WcStatus::RemoteAccess {
            self.fail_request(inner, request, status, out);
            return;
        }
        // A bind moves nothing; a read or write done here (`try_inline`) all it asked.
        let (new_rkey, moved) = match request.kind {
            Kind::Bind { new_rkey, .. } => (new_rkey, false),
            _ => (0, status == WcStatus::Success),
        };
        let num = self.num;
        inner.sends.mark(request.token, |s| WorkCompletion {
            new_rkey,
            ..WorkCompletion::new(
                s.wr_id,
                status,
                s.opcode,
                if moved { s.len } else { 0 },
                num,
            )
        });
        inner.sends.release(out);
    }

    /// Whether the newest request must wait for every earlier one because the
    /// provider would not keep DAT's order (`Domain::ordered`): all but a
    /// send following a send (send-after-send order every provider keeps);
    /// and a read behind a send not yet complete where reads wait for sends
    /// (`Domain::reads_after_sends`).
    pub(super) fn unordered(&self, dev: &Domain, inner: &Inner) -> bool {
        let n = inner.sends.slots.len();
        if n < 2 {
            return false;
        }
        if dev.reads_after_sends && inner.sends.slots[n - 1].opcode == WcOpcode::RdmaRead {
            let send = |s: &Slot| s.opcode == WcOpcode::Send && s.done.is_none();
            if inner.sends.slots.iter().take(n - 1).any(send) {
                return true;
            }
        }
        if dev.ordered {
            return false;
        }
        let is_send = |i: usize| inner.sends.slots[i].opcode == WcOpcode::Send;
        !is_send(n - 1) || !is_send(n - 2)
    }

    /// Posts `wr` under the QP's lock; what completes at once goes to `out`.
    pub(super) fn post_locked(
        &self,
        wr: &SendWr,
        out: &mut VecDeque<WorkCompletion>,
    ) -> Result<()> {
        let mut inner = self.inner.lock();
        match inner.state {
            QpState::Connected => self.post_request(&mut inner, wr, out),
            QpState::Error => {
                out.push_back(
                    WorkCompletion::flushed(wr.wr_id, wr.op.opcode(), self.num).with_ctx(wr.ctx),
                );
                Ok(())
            }
            _ => Err(Error::NotConnected),
        }
    }

    /// Whether the provider has room for one more request (two places are
    /// kept for the backend's own reads and writes: a lookup, a farewell).
    pub(super) fn provider_room(&self, inner: &Inner, kind: &Kind) -> bool {
        let need = match kind {
            Kind::Write { imm: Some(_), .. } => 2,
            _ => 1,
        };
        inner.sends_given + need <= self.depths.1.saturating_sub(2).max(need)
    }

    /// Has the held requests posted again after the provider said it was busy.
    /// With requests of ours still at the provider, the next one's completion
    /// does it (each calls `release_held`), on whichever thread reads the CQ:
    /// asking the progress thread as well woke it at every refusal while a
    /// polling consumer kept a window of large transfers going (shm refuses a
    /// peer's RMA while one of its transfers is segmented), and the two then
    /// spun on shm's locks on two CPUs (1 MiB reads 0.70x of raw shm's).
    /// With none, nothing else would come back here: the progress thread does.
    pub(super) fn retry_busy(&self, dev: &Domain, inner: &Inner) {
        if inner.sends_given == 0 {
            dev.retry_later(self.num);
        }
    }

    pub(super) fn send_room(&self, inner: &Inner) -> bool {
        inner.sends.slots.len() < self.cap.max_send_wr.max(1) as usize
    }

    /// Posts the held requests whose turn came: a fenced one once nothing
    /// before it is outstanding. One the provider refuses completes in error.
    /// Nothing goes once a request broke the connection (a remote access
    /// error, ours or the provider's): what follows it is flushed when the
    /// connection breaks, never executed, as on an RDMA NIC.
    pub(super) fn release_held(&self, inner: &mut Inner, out: &mut VecDeque<WorkCompletion>) {
        while let Some(front) = inner.held.front() {
            if inner.broke {
                return;
            }
            let first = front.token.wrapping_sub(inner.sends.base) & TOKEN_MASK == 0;
            if (front.fence && !first) || inner.segmented.is_some() {
                // Its completion comes back here.
                return;
            }
            let rkey = front.kind.rkey();
            let local = matches!(front.kind, Kind::Bind { .. });
            let room = local || self.provider_room(inner, &front.kind);
            let Some(dev) = self.dev.upgrade() else {
                return;
            };
            if self.needs_lookup(inner, rkey) {
                let rkey = rkey.expect("an RDMA request");
                match self.start_lookup(inner, rkey) {
                    // Its completion calls this again.
                    Ok(()) => return,
                    Err(Error::NoResource(Resource::WorkQueue)) if dev.rdm => {
                        // Busy (see `post_request`): tried again soon.
                        self.retry_busy(&dev, inner);
                        return;
                    }
                    Err(e) => {
                        // The request cannot learn where to go: it fails, the rest go on.
                        log::debug!("key lookup: {e:?}");
                        let request = inner.held.pop_front().expect("front checked");
                        self.fail_request(inner, &request, WcStatus::LocalQpOp, out);
                        continue;
                    }
                }
            }
            if !room {
                // A completion makes room, and comes back here.
                return;
            }
            let request = inner.held.pop_front().expect("front checked");
            let done = match self.issue(inner, &request) {
                Err(Error::NoResource(Resource::WorkQueue)) if dev.rdm => {
                    // Busy (see `post_request`): it keeps its place.
                    inner.held.push_front(request);
                    self.retry_busy(&dev, inner);
                    return;
                }
                Err(e) => {
                    log::debug!("a held request failed at post: {e:?}");
                    Some(WcStatus::LocalQpOp)
                }
                Ok(done) => done,
            };
            if let Some(status) = done {
                self.finish_local(inner, &request, status, out);
                if inner.break_pending {
                    // What follows is flushed when the connection breaks.
                    return;
                }
            }
        }
    }

    /// Completes `request` now with `status` (in order: its slot is marked).
    pub(super) fn fail_request(
        &self,
        inner: &mut Inner,
        request: &Request,
        status: WcStatus,
        out: &mut VecDeque<WorkCompletion>,
    ) {
        let num = self.num;
        inner.sends.mark(request.token, |s| {
            WorkCompletion::new(s.wr_id, status, s.opcode, 0, num)
        });
        inner.sends.release(out);
        if status == WcStatus::RemoteAccess {
            // As on an RDMA NIC, a remote access error breaks the connection.
            inner.broke = true;
            inner.break_pending = true;
        }
    }

    /// One request to the provider; a bind the backend executes now, giving
    /// its completion's status (None: the provider completes the request).
    pub(super) fn issue(&self, inner: &mut Inner, request: &Request) -> Result<Option<WcStatus>> {
        let ep = Self::ep_of(inner).ok_or(Error::NotConnected)?;
        let refused = self.refused(inner, request);
        let known = request.kind.rkey().and_then(|k| inner.starts.get(&k));
        let fresh = self
            .dev
            .upgrade()
            .is_some_and(|d| d.fresh_lookup(known.copied().flatten().as_ref()));
        // The next request through this key reads its entry again (after
        // this one's address is taken from it: `remote_target`).
        let forget = request.kind.rkey().filter(|_| fresh);
        if let Some(rkey) = forget.filter(|_| refused || request.len == 0) {
            inner.starts.remove(&rkey);
        }
        if refused {
            return Ok(Some(WcStatus::RemoteAccess));
        }
        if let Kind::Bind {
            mw,
            mr,
            addr,
            length,
            access,
            new_rkey,
        } = &request.kind
        {
            let Some(mw) = mw.as_any().downcast_ref::<OfiMw>() else {
                return Ok(Some(WcStatus::MwBind));
            };
            return Ok(Some(mw.bind(
                mr.as_ref(),
                *addr,
                *length,
                *access,
                *new_rkey,
            )));
        }
        if let Some(status) = self.try_inline(inner, request) {
            return Ok(Some(status));
        }
        if self.rdm && Self::peer_gone(inner) {
            // Held as for a busy provider until the connection's end flushes it.
            return Err(Error::NoResource(Resource::WorkQueue));
        }
        let dev = self.dev.upgrade().ok_or(Error::NoDevice)?;
        if dev.rdm
            && request.len == 0
            && matches!(
                request.kind,
                Kind::Read { .. } | Kind::Write { imm: None, .. }
            )
        {
            // Nothing to move (shm never completes an empty RMA): done, in order.
            return Ok(Some(WcStatus::Success));
        }
        let (iov, mut desc) = io_vectors(&dev, &request.sgl);
        // shm never completes a message of one empty segment; of none it does.
        let segments = if dev.rdm && request.len == 0 {
            0
        } else {
            iov.len()
        };
        let context = self.context(request.token);
        let flags = fi::FI_COMPLETION as u64;
        // Sends and writes complete once their data is placed at the target,
        // as on an RDMA NIC (not merely once it left).
        let placed = flags | fi::FI_DELIVERY_COMPLETE as u64;
        // SAFETY: an enabled endpoint; the message structs and vectors live for the call.
        let rc = unsafe {
            match request.kind {
                Kind::Send { data } => {
                    let with_data = data.map_or(0, |_| fi::FI_REMOTE_CQ_DATA as u64);
                    // An empty message has nothing to place (and shm never
                    // reports one delivered).
                    // Where the peer's receipt tells (`Domain::receipts`),
                    // the provider's own word of delivery would cost a second
                    // answer from the peer.
                    let when = if segments == 0 || dev.receipts {
                        flags
                    } else {
                        placed
                    };
                    if self.rdm {
                        // Over a port: tagged with the peer connection's id
                        // (and how it lands: `eager`).
                        match self.message_tag(inner, request) {
                            Err(rc) => rc,
                            Ok(tag) => {
                                let msg = fi::fi_msg_tagged {
                                    msg_iov: or_null(&iov).cast(),
                                    desc: or_null_mut(&mut desc),
                                    iov_count: segments,
                                    addr: inner.dest,
                                    tag,
                                    ignore: 0,
                                    context,
                                    data: data.unwrap_or(0),
                                };
                                let rc = fi::fi_tsendmsg(ep, &msg, when | with_data);
                                if rc == 0 {
                                    inner.announced = None;
                                }
                                rc
                            }
                        }
                    } else {
                        let msg = fi::fi_msg {
                            msg_iov: or_null(&iov).cast(),
                            desc: or_null_mut(&mut desc),
                            iov_count: segments,
                            context,
                            addr: inner.dest,
                            data: data.unwrap_or(0),
                        };
                        fi::fi_sendmsg(ep, &msg, when | with_data)
                    }
                }
                Kind::Write { va, rkey, .. } | Kind::Read { va, rkey } => {
                    let (addr, key) = remote_target(&dev, inner, va, rkey);
                    let rma = fi::fi_rma_iov {
                        addr,
                        len: request.len as usize,
                        key,
                    };
                    let msg = fi::fi_msg_rma {
                        msg_iov: or_null(&iov).cast(),
                        desc: or_null_mut(&mut desc),
                        iov_count: iov.len(),
                        rma_iov: &rma,
                        rma_iov_count: 1,
                        context,
                        addr: inner.dest,
                        ..Default::default()
                    };
                    match request.kind {
                        Kind::Read { .. } => fi::fi_readmsg(ep, &msg, flags),
                        Kind::Write { imm: Some(_), .. } => {
                            let msg = fi::fi_msg_rma {
                                context: self.context(request.token | WRITE_PART),
                                ..msg
                            };
                            fi::fi_writemsg(ep, &msg, placed)
                        }
                        _ => fi::fi_writemsg(ep, &msg, placed),
                    }
                }
                Kind::Atomic { va, rkey, op } => {
                    let (addr, key) = remote_target(&dev, inner, va, rkey);
                    self.post_atomic(inner, request, addr, key, op, &iov, &mut desc)
                }
                Kind::Bind { .. } => unreachable!("executed above"),
            }
        };
        if let Some(rkey) = forget {
            inner.starts.remove(&rkey);
        }
        crate::check(rc, "post", Error::NoResource(Resource::WorkQueue))?;
        if let Some(peer) = inner.peer_keys.as_ref() {
            // A target on this host sleeping at its idle pace serves it now.
            peer.ring();
        }
        inner.sends_given += 1;
        if matches!(request.kind, Kind::Read { .. }) && dev.segmented_read(request.len) {
            inner.segmented = Some(request.token);
        }
        if let Kind::Send { .. } = request.kind {
            self.await_receipt(&dev, inner, request.token);
        }
        if let Kind::Write { imm: Some(imm), .. } = request.kind {
            if dev.ordered {
                self.close_write_imm(inner, request.token, request.len, imm);
            } else if let Some(slot) = inner.sends.get_mut(request.token) {
                // The provider could deliver the send before the write's data
                // (shm has no FI_ORDER_SAW): it goes once the write completes
                // (delivered: FI_DELIVERY_COMPLETE).
                slot.closing_imm = Some(imm);
            }
        }
        Ok(None)
    }

    /// Posts an atomic on the peer's word at `addr` (as the provider addresses
    /// it) of `rkey`: `fi_fetch_atomicmsg` (FI_SUM) or `fi_compare_atomicmsg`
    /// (FI_CSWAP) on one FI_UINT64, its result into the request's segment
    /// (`iov`, `desc`: registered memory of the consumer's LMR). The operands
    /// are the slot's, alive until the request completes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn post_atomic(
        &self,
        inner: &mut Inner,
        request: &Request,
        addr: u64,
        key: u64,
        op: AtomicOp,
        iov: &[libc::iovec],
        desc: &mut [*mut libc::c_void],
    ) -> isize {
        let Some(ep) = Self::ep_of(inner) else {
            return -(fi::FI_ENOTCONN as isize);
        };
        let dest = inner.dest;
        let Some(operands) = inner
            .sends
            .get_mut(request.token)
            .and_then(|s| s.operands.as_mut())
        else {
            return -(fi::FI_EINVAL as isize);
        };
        let [origin, compare] = &mut **operands;
        let word = |value: &mut u64| fi::fi_ioc {
            addr: (value as *mut u64).cast(),
            count: 1,
        };
        let (origin, compare) = (word(origin), word(compare));
        let mut result = fi::fi_ioc {
            addr: iov[0].iov_base,
            count: 1,
        };
        let target = fi::fi_rma_ioc {
            addr,
            count: 1,
            key,
        };
        let msg = fi::fi_msg_atomic {
            msg_iov: &origin,
            desc: null_mut(),
            iov_count: 1,
            addr: dest,
            rma_iov: &target,
            rma_iov_count: 1,
            datatype: fi::fi_datatype_FI_UINT64,
            op: match op {
                AtomicOp::FetchAdd { .. } => fi::fi_op_FI_SUM,
                AtomicOp::CmpSwap { .. } => fi::fi_op_FI_CSWAP,
            },
            context: self.context(request.token),
            data: 0,
        };
        let flags = fi::FI_COMPLETION as u64;
        // SAFETY: an enabled endpoint; the operands live in the request's
        // slot until it completes, the result buffer is the consumer's
        // registered segment, the structs live for the call.
        unsafe {
            match op {
                AtomicOp::FetchAdd { .. } => {
                    fi::fi_fetch_atomicmsg(ep, &msg, &mut result, desc.as_mut_ptr(), 1, flags)
                }
                AtomicOp::CmpSwap { .. } => fi::fi_compare_atomicmsg(
                    ep,
                    &msg,
                    &compare,
                    null_mut(),
                    1,
                    &mut result,
                    desc.as_mut_ptr(),
                    1,
                    flags,
                ),
            }
        }
    }

    /// The tag of send `request` to the peer connection: as is where the
    /// provider matches the peer's receives (`DIRECT`); else eager, or a
    /// large message's, announced first (once: a send refused for now is
    /// retried without a second announce). Err: the announce's refusal.
    pub(super) fn message_tag(
        &self,
        inner: &mut Inner,
        request: &Request,
    ) -> std::result::Result<u64, isize> {
        let peer = inner.peer_tag;
        if peer & DIRECT != 0 {
            return Ok(peer);
        }
        if request.len as usize <= EAGER_MAX {
            return Ok(peer | EAGER);
        }
        if inner.announced != Some(request.token) {
            let ep = Self::ep_of(inner).ok_or(-(fi::FI_ENOTCONN as isize))?;
            // SAFETY: an enabled endpoint and a peer in its AV; no payload.
            let rc =
                unsafe { fi::fi_tinject(ep, null_mut(), 0, inner.dest, peer | EAGER | ANNOUNCE) };
            if rc != 0 {
                return Err(rc);
            }
            inner.announced = Some(request.token);
        }
        Ok(peer | LARGE)
    }

    /// The send that follows the write of an RDMA write with immediate data:
    /// no payload, the immediate data and the write's length in its remote CQ
    /// data; it consumes the target's receive, after the write's data (send
    /// after write order), and its completion is the request's. Should the
    /// provider refuse it, the request fails (its write is posted already).
    pub(super) fn close_write_imm(&self, inner: &mut Inner, token: u32, len: u64, imm: u32) {
        // 8 bytes of CQ data carry the length; 4 only the data, the tag the
        // length (reliable datagrams: see `IMM_CLOSE`).
        let eight = self.dev.upgrade().is_some_and(|d| d.remote_data());
        let (data, tag_bits) = if eight {
            (WRITE_IMM | imm as u64 | (len << 34), 0)
        } else {
            (imm as u64, imm_close_tag(len))
        };
        let msg = fi::fi_msg {
            context: self.context(token),
            addr: inner.dest,
            data,
            ..Default::default()
        };
        let mut flags = (fi::FI_COMPLETION | fi::FI_REMOTE_CQ_DATA) as u64;
        if !self.rdm {
            // Over reliable datagrams the write was delivered before (or is
            // ordered before) this empty send, which shm never reports
            // delivered (see `issue`).
            flags |= fi::FI_DELIVERY_COMPLETE as u64;
        }
        let eager = inner.peer_tag & DIRECT == 0;
        let tagged = fi::fi_msg_tagged {
            addr: msg.addr,
            tag: inner.peer_tag | tag_bits | if eager { EAGER } else { 0 },
            context: msg.context,
            data: msg.data,
            ..Default::default()
        };
        let gone = self.rdm && Self::peer_gone(inner);
        let posted = Self::ep_of(inner).map_or(-(fi::FI_ENOTCONN as isize), |ep| {
            if gone {
                // As busy: kept until the connection's end (`peer_gone`).
                return -(fi::FI_EAGAIN as isize);
            }
            // SAFETY: an enabled endpoint; no buffers.
            unsafe {
                if self.rdm {
                    fi::fi_tsendmsg(ep, &tagged, flags)
                } else {
                    fi::fi_sendmsg(ep, &msg, flags)
                }
            }
        });
        let posted = crate::check(posted, "post (immediate data)", Error::Internal);
        if posted.is_ok() {
            inner.sends_given += 1;
            if let Some(dev) = self.dev.upgrade() {
                self.await_receipt(&dev, inner, token);
            }
        } else if self.rdm && posted == Err(Error::NoResource(Resource::WorkQueue)) {
            // Busy (see `post_request`): posted again soon, in order.
            inner.unclosed.push_back((token, len, imm));
            if let Some(dev) = self.dev.upgrade() {
                dev.retry_later(self.num);
            }
        } else {
            let num = self.num;
            inner.sends.mark(token, |s| {
                WorkCompletion::new(s.wr_id, WcStatus::LocalQpOp, s.opcode, 0, num)
            });
        }
    }
}

impl AtomicOp {
    /// The operands as the provider reads them: the origin value (what is
    /// added, or swapped in), then the compare value.
    pub(super) fn operands(self) -> [u64; 2] {
        match self {
            AtomicOp::FetchAdd { add } => [add, 0],
            AtomicOp::CmpSwap { compare, swap } => [swap, compare],
        }
    }
}

impl Kind {
    /// An atomic, where the device has them (`Domain::atomics`); its one
    /// segment receives the target word's previous value.
    pub(super) fn atomic(
        wr: &SendWr,
        atomics: bool,
        va: u64,
        rkey: u32,
        op: AtomicOp,
    ) -> Result<Kind> {
        if !atomics {
            return Err(Error::Unsupported);
        }
        if wr.sgl.len() != 1 || wr.sgl[0].length != 8 {
            return Err(Error::TooLong);
        }
        Ok(Kind::Atomic { va, rkey, op })
    }

    /// What `wr` asks of `dev`'s provider (remote CQ data, atomics: refused
    /// where it has none).
    pub(super) fn of(wr: &SendWr, dev: &Domain) -> Result<Kind> {
        let (remote_data, atomics) = (dev.remote_data(), dev.atomics);
        Ok(match &wr.op {
            SendOp::Send => Kind::Send { data: None },
            SendOp::SendInv { rkey } => Kind::Send {
                data: Some(invalidation_data(dev, *rkey).ok_or(Error::Unsupported)?),
            },
            SendOp::RdmaWrite { remote_addr, rkey } => Kind::Write {
                va: *remote_addr,
                rkey: *rkey,
                imm: None,
            },
            SendOp::RdmaWriteImm {
                remote_addr,
                rkey,
                imm,
            } => {
                if !dev.write_imm() {
                    return Err(Error::Unsupported);
                }
                let max = if remote_data {
                    MAX_IMM_WRITE
                } else {
                    MAX_IMM_WRITE_TAGGED
                };
                if wr.sgl.iter().map(|s| s.length as u64).sum::<u64>() > max {
                    return Err(Error::TooLong);
                }
                Kind::Write {
                    va: *remote_addr,
                    rkey: *rkey,
                    imm: Some(*imm),
                }
            }
            SendOp::RdmaRead { remote_addr, rkey } => Kind::Read {
                va: *remote_addr,
                rkey: *rkey,
            },
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => Kind::atomic(
                wr,
                atomics,
                *remote_addr,
                *rkey,
                AtomicOp::FetchAdd { add: *add },
            )?,
            SendOp::CmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => Kind::atomic(
                wr,
                atomics,
                *remote_addr,
                *rkey,
                AtomicOp::CmpSwap {
                    compare: *compare,
                    swap: *swap,
                },
            )?,
            SendOp::BindMw {
                mw,
                mr,
                addr,
                length,
                access,
                new_rkey,
            } => Kind::Bind {
                mw: mw.clone(),
                mr: mr.clone(),
                addr: *addr,
                length: *length,
                access: *access,
                new_rkey: *new_rkey,
            },
        })
    }

    /// The remote key of an RDMA request.
    pub(super) fn rkey(&self) -> Option<u32> {
        match self {
            Kind::Write { rkey, .. } | Kind::Read { rkey, .. } | Kind::Atomic { rkey, .. } => {
                Some(*rkey)
            }
            _ => None,
        }
    }
}

/// The remote CQ data of a send invalidating the peer's `rkey`
/// (`INVALIDATE`): flagged where the provider carries 8 bytes, the rkey
/// alone where it carries 4 (verbs: no write with immediate data is offered
/// there, the only other use); None where it carries less.
fn invalidation_data(dev: &Domain, rkey: u32) -> Option<u64> {
    // SAFETY: the domain attributes of our fi_info.
    let size = unsafe { (*(*dev.info.ptr()).domain_attr).cq_data_size };
    match size {
        8.. => Some(INVALIDATE | rkey as u64),
        4.. => Some(rkey as u64),
        _ => None,
    }
}

/// The address and key the provider wants for the peer's virtual address
/// `va` of context `rkey`: the offset from the start of its registration
/// where the provider addresses by offset, else `va` itself; the provider's
/// key of the registration, as the peer's entry names it (read before:
/// `needs_lookup`).
fn remote_target(dev: &Domain, inner: &Inner, va: u64, rkey: u32) -> (u64, u64) {
    let found = inner.starts.get(&rkey).copied().flatten();
    let key = found.map_or(rkey as u64, |r| r.provider_key);
    if dev.virt_addr {
        return (va, key);
    }
    (va.wrapping_sub(found.map_or(NOT_AT_PEER, |r| r.start)), key)
}

/// Registers a lookup buffer for the QP's reads of peer key tables.
fn register_lookup(dev: &Domain, buf: &mut [u8; ENTRY_BYTES]) -> Result<Fid<fi::fid_mr>> {
    // The buffer is the QP's, alive while the registration is.
    let key = dev.next_key.fetch_add(1, Ordering::Relaxed);
    crate::mem::register(
        dev,
        buf.as_mut_ptr() as u64,
        ENTRY_BYTES as u64,
        (fi::FI_READ | fi::FI_RECV) as u64,
        key,
        "fi_mr_regattr (lookup)",
    )
}
