//! Socket I/O of the TCP transport: reading and decoding frames (and placing large read
//! answers straight into registered memory), reading a same-host connection's ring, and
//! writing queued output. Who calls these, and when: progress.rs (the progress thread) and
//! the CQs' drivers and pollers (../mod.rs).

use super::*;

/// What `Engine::next_frame` found on a connection.
enum Next {
    /// A frame, with the connection's phase when it was read.
    Frame(Phase, Header, Vec<u8>),
    /// Room was made in the budget for the frame: look at it again.
    Again,
    /// Nothing (more) to read now, or the connection is gone or broken.
    Stop,
}

impl Engine {
    pub(super) fn process_frames(&mut self, sh: &Shared, token: u64) {
        self.process_frames_uncharged(sh, token);
        if let Some(c) = self.conns.get_mut(&token) {
            c.recharge();
        }
    }

    fn process_frames_uncharged(&mut self, sh: &Shared, token: u64) {
        loop {
            let (phase, h, p) = match self.next_frame(sh, token) {
                Next::Frame(phase, h, p) => (phase, h, p),
                Next::Again => continue,
                Next::Stop => return,
            };
            self.frames_served += 1;
            let more = match phase {
                Phase::Closing => true,
                Phase::PassiveAwaitHello { listener } => self.hello(token, listener, &h, p),
                Phase::PassiveRequested { .. } | Phase::PassiveUdRequested { .. } => {
                    self.protocol_error(token, "data before accept");
                    false
                }
                Phase::UdAwaitReply { id } => {
                    self.ud_reply(token, id, &h, p);
                    true
                }
                Phase::ActiveAwaitReply { qp } => self.connect_reply(sh, token, qp, &h, p),
                Phase::Established { qp } => self.established_frame(sh, token, qp, h, p),
            };
            if !more {
                return;
            }
        }
    }

    /// The next frame of connection `token`, with the phase it was read in, if one is
    /// complete and admitted; `Again` once room was made in the budget for it.
    #[inline]
    fn next_frame(&mut self, sh: &Shared, token: u64) -> Next {
        let Some(c) = self.conns.get_mut(&token) else {
            return Next::Stop;
        };
        let phase = c.phase;
        // A frame we would keep must fit in the device's budget (budget.rs), unless it is
        // a SEND that goes straight into a posted receive as it arrives, or a WRITE that
        // goes straight into the memory it names (`take_over_send`, `take_over_write`).
        let room = c.room();
        let streams_writes = c.may_stream_send();
        let streams = streams_writes && self.qps.get(&qp_of(phase)).is_some_and(streams_into);
        let mut over_budget = None;
        let admit = |h: &Header| {
            if !allowed_in(phase, h.kind) {
                return false;
            }
            let len = h.payload_len as usize;
            // A request may be held (its answers unread, or no receive for it): it costs
            // what holding it counts, so that payload-less ones cannot pile up past the
            // budget either (a flood of zero-length WRITEs whose ACKs are never read).
            let cost = held_cost(len);
            let kept = cost > room
                && !matches!(h.kind, Kind::Ack | Kind::ReadResp)
                && !(streams && h.kind == Kind::Send && len >= wire::DIRECT_READ_MIN)
                && !(streams_writes && h.kind == Kind::Write && len >= wire::DIRECT_READ_MIN);
            over_budget = kept.then_some(cost);
            !kept
        };
        match c.dec.next_frame_if(&sh.limits, admit) {
            Ok(Some((h, p))) => Next::Frame(phase, h, p),
            Ok(None) => Next::Stop,
            Err(_) if over_budget.is_some() => {
                if self.evict_for(token, over_budget.unwrap_or(0)) {
                    return Next::Again; // room made: the same header is looked at again
                }
                let limit = self.peer_memory.limit();
                self.protocol_error(
                    token,
                    &format!("a frame past the device's peer memory budget ({limit} bytes, DAPLRS_PEER_MEMORY)"),
                );
                Next::Stop
            }
            Err(err) => {
                self.protocol_error(token, &format!("{err:?}"));
                Next::Stop
            }
        }
    }

    /// A HELLO on connection `token`, accepted by `listener`: a connection request for the
    /// consumer (refused if too many wait). Whether to read on.
    fn hello(&mut self, token: u64, listener: u64, h: &Header, p: Vec<u8>) -> bool {
        if h.kind != Kind::Hello {
            self.protocol_error(token, "expected HELLO");
            return false;
        }
        if !self.request_room(listener) {
            log::warn!("listener {listener}: too many connection requests pending; refusing one");
            if let Some(c) = self.conns.get_mut(&token) {
                let mut h = Header::new(Kind::Reject);
                h.status = Status::RemoteInvalid;
                c.out.push_frame(h, Vec::new());
                c.begin_close();
            }
            self.try_write(token);
            return false;
        }
        let Some(c) = self.conns.get_mut(&token) else {
            return false;
        };
        let ud = h.flags & wire::FLAG_UD != 0;
        c.same_host.peer_advertised = !ud && h.flags & wire::FLAG_SAME_HOST != 0;
        c.phase = if ud {
            Phase::PassiveUdRequested {
                listener,
                qpn: h.length,
            }
        } else {
            Phase::PassiveRequested { listener }
        };
        c.deadline = None;
        let (remote, local) = (v4(c.stream.peer_addr()), v4(c.stream.local_addr()));
        match (remote, local) {
            (Some(remote), Some(local)) if ud => self.emit(CmEvent::UdRequest {
                listener,
                req: token,
                private_data: p,
                remote,
                local,
            }),
            (Some(remote), Some(local)) => self.emit(CmEvent::ConnectRequest {
                listener,
                req: token,
                private_data: p,
                remote,
                local,
            }),
            _ => {
                self.conns.remove(&token);
                return false;
            }
        }
        true
    }

    /// The target's ACCEPT or REJECT of our connection request for `qp`. Whether to read on.
    fn connect_reply(&mut self, sh: &Shared, token: u64, qp: u32, h: &Header, p: Vec<u8>) -> bool {
        match h.kind {
            Kind::Accept => {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.phase = Phase::Established { qp };
                    c.deadline = None;
                    c.arm_signal();
                }
                if !self.same_host_accepted(sh, token, qp, h.flags) {
                    return false;
                }
                self.rewatch(token);
                if let Some(e) = self.qps.get_mut(&qp) {
                    e.state = QpState::Connected;
                    e.deadline = None;
                }
                self.emit(CmEvent::Established {
                    qp_num: qp,
                    private_data: p,
                });
                true
            }
            Kind::Reject => {
                let by_peer = h.status == Status::Ok;
                self.fail_qp(
                    qp,
                    Some(CmEvent::Rejected {
                        qp_num: qp,
                        private_data: p,
                        by_peer,
                    }),
                );
                false
            }
            _ => {
                self.protocol_error(token, "expected ACCEPT or REJECT");
                false
            }
        }
    }

    /// A frame on established connection `token` of `qp`: a request to serve (in order, held
    /// while earlier ones wait), an answer to ours, or the connection's own business. Whether
    /// to read on.
    #[inline]
    fn established_frame(
        &mut self,
        sh: &Shared,
        token: u64,
        qp: u32,
        h: Header,
        p: Vec<u8>,
    ) -> bool {
        match h.kind {
            Kind::Send
            | Kind::Write
            | Kind::ReadReq
            | Kind::WriteImm
            | Kind::Atomic
            | Kind::Placed => return self.request_frame(sh, token, qp, h, p),
            Kind::Ack | Kind::ReadResp => self.response(sh, qp, &h, &p, None),
            Kind::SameHost => self.same_host_offer(sh, token, qp, &p),
            Kind::Switch => return self.same_host_switch(sh, token, h.flags),
            // Our ring has room again for what we queued.
            Kind::Doorbell => self.try_write(token),
            Kind::Disconnect => {
                self.peer_ended(token, PeerEnd::Disconnect);
                return false;
            }
            _ => {
                self.protocol_error(token, "handshake frame on an established connection");
                return false;
            }
        }
        true
    }

    /// A peer's request: served now, or held (in order) behind those already held. Whether
    /// to read on.
    #[inline]
    fn request_frame(&mut self, sh: &Shared, token: u64, qp: u32, h: Header, p: Vec<u8>) -> bool {
        let holding = self
            .conns
            .get(&token)
            .map(|c| !c.held.is_empty())
            .unwrap_or(false);
        let outcome = if holding {
            Outcome::Hold
        } else {
            self.target_request(sh, token, qp, &h, &p)
        };
        match outcome {
            Outcome::Done => {}
            Outcome::Hold => {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.held_bytes += held_cost(p.len());
                    c.held.push_back((h, p));
                }
            }
            Outcome::Broken => return false,
        }
        self.try_write(token);
        true
    }

    /// Writes what the socket takes now; the progress thread writes the rest.
    pub(crate) fn try_write(&mut self, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if c.write_failed || c.draining || !c.output_due() {
            return;
        }
        match c.flush_out() {
            Ok(()) => {
                if c.signalled {
                    c.out.keep_ack_room(); // for a signal handler (signalled.rs)
                }
                if c.answer_bytes > 0 {
                    c.recharge(); // answers the peer took no longer count (budget.rs)
                }
                if std::mem::take(&mut c.wait_drain) {
                    self.drained.push(token);
                    self.wake_needed = true;
                }
                if c.close_when_flushed {
                    // Lingering close: our end of stream now, the socket once the peer's
                    // comes (see CLOSE_LINGER).
                    let _ = c.stream.shutdown(std::net::Shutdown::Write);
                    c.draining = true;
                    self.wake_needed = true;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                // Whoever watches the socket writes the rest when it takes more: the progress
                // thread, or the application thread driving it, which may not be watching
                // for output yet.
                self.wake_needed = true;
                if let Some(cq) = c.driven {
                    self.deferred.push(Deferred::Interrupt(cq));
                }
            }
            Err(_) => {
                // The peer closed or reset the connection. What it sent before still sits in
                // the socket (above all the answer that explains why: a refused RDMA access
                // must complete as REMOTE_ACCESS, not be flushed with the rest), so it is read
                // and processed before the loss is reported, by the progress thread, which
                // has the read buffer.
                c.write_failed = true;
                self.failed_writes.push(token);
                self.wake_needed = true;
            }
        }
        self.stop_ack_timer_if_sent();
    }

    /// Reads out the connections whose write failed, then reports them lost.
    pub(crate) fn settle_failed_writes(&mut self, sh: &Shared, buf: &mut [u8]) {
        for token in std::mem::take(&mut self.failed_writes) {
            self.read_conn(sh, token, buf);
            if self.conns.contains_key(&token) {
                self.conn_lost(token);
            }
        }
    }

    /// Reads and serves what the peer of connection `token` sent. A panic while doing so (a
    /// bug: nothing a peer sends should cause one) is caught here and costs that connection
    /// only (broken, as for a protocol error), not the thread serving every other one.
    pub(crate) fn read_conn(&mut self, sh: &Shared, token: u64, buf: &mut [u8]) {
        self.guarded(token, |eng| eng.read_conn_unguarded(sh, token, buf));
    }

    /// A polling consumer's look at connection `token`: as `read_conn`, except that when the
    /// peer writes into our ring only the ring is read. The socket then carries only the end
    /// of stream (and doorbells from a peer without our ring's bell), which the progress
    /// thread reads: it keeps polling the socket while the consumer polls. One system call
    /// less per look, on the path of every message a polling consumer waits for.
    pub(crate) fn look_at_conn(&mut self, sh: &Shared, token: u64, buf: &mut [u8]) {
        let ring = self
            .conns
            .get(&token)
            .is_some_and(|c| c.same_host.reading_ring().is_some());
        self.guarded(token, |eng| match ring {
            true => eng.read_ring_conn(sh, token, buf, false),
            false => eng.read_conn_unguarded(sh, token, buf),
        });
    }

    fn guarded(&mut self, token: u64, serve: impl FnOnce(&mut Self)) {
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(self)));
        if served.is_err() {
            self.panics += 1;
            log::error!("connection {token}: panic while serving it; dropping it");
            self.drop_conn(token);
        }
    }

    fn read_conn_unguarded(&mut self, sh: &Shared, token: u64, buf: &mut [u8]) {
        for _ in 0..64 {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            if c.same_host.reading_ring().is_some() {
                // The peer's SWITCH came (maybe in the read just handled): the rest of its
                // frames are in our ring.
                self.read_ring_conn(sh, token, buf, true);
                return;
            }
            if c.is_closing() {
                // Nothing the peer sends now is processed: read and discard until its end of
                // stream, which ends the connection.
                match c.stream.read(buf) {
                    Ok(0) => {
                        self.conns.remove(&token);
                        return;
                    }
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        self.conns.remove(&token);
                        return;
                    }
                }
            }
            if c.sink.is_some() {
                match self.read_sink(sh, token, buf) {
                    SinkStep::More => continue,
                    SinkStep::Blocked => break,
                    SinkStep::Gone => return,
                }
            }
            if !c.wants_input() {
                break;
            }
            // Large payloads go straight into their frame buffer.
            let result = match c.dec.read_direct(&mut c.stream) {
                Some(r) => r.map(|n| (n, true)),
                None => c.stream.read(buf).map(|n| (n, false)),
            };
            match result {
                Ok((0, _)) => {
                    // Let frames already received be handled before the loss is reported.
                    self.process_frames(sh, token);
                    self.peer_ended(token, PeerEnd::Lost);
                    return;
                }
                Ok((n, direct)) => {
                    if !direct {
                        c.dec.feed(&buf[..n]);
                    }
                    self.process_frames(sh, token);
                    if let Some(c) = self.conns.get_mut(&token) {
                        c.pace_input();
                    }
                    self.take_over_read(sh, token);
                    self.take_over_send(sh, token);
                    self.take_over_write(sh, token);
                    if self
                        .conns
                        .get(&token)
                        .is_some_and(|c| c.same_host.reading_ring().is_some())
                    {
                        // A SWITCH: what followed it here were doorbells for frames already
                        // in our ring (dropped with the decoder's rest): read the ring now,
                        // or nobody is woken for them (a waiter counted on the ring sleeps on).
                        self.read_ring_conn(sh, token, buf, true);
                        return;
                    }
                    if !direct && n < buf.len() {
                        // The socket had no more: spare the read that would say so (poll
                        // reports whatever comes next).
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.process_frames(sh, token);
                    self.peer_ended(token, PeerEnd::Lost);
                    return;
                }
            }
        }
    }

    /// When the frame being received is the answer to our oldest request, a large RDMA read,
    /// its payload is read from here on straight into the read's local buffers.
    pub(super) fn take_over_read(&mut self, sh: &Shared, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let Phase::Established { qp } = c.phase else {
            return;
        };
        let Some(h) = c.dec.pending() else { return };
        if c.sink.is_some()
            || h.kind != Kind::ReadResp
            || h.status != Status::Ok
            || (h.payload_len as usize) < wire::DIRECT_READ_MIN
        {
            return;
        }
        let Some(e) = self.qps.get(&qp) else { return };
        let Some(o) = e.outstanding.front() else {
            return;
        };
        if o.local.is_some()
            || o.opcode != WcOpcode::RdmaRead
            || o.seq != h.seq
            || o.len != h.payload_len
        {
            return; // `response` will say what is wrong
        }
        let Some((header, partial)) = c.dec.take_pending() else {
            return;
        };
        let (sgl, pd) = (o.read_sgl.clone(), e.pd);
        let failed = sh.keys.read().scatter(&sgl, pd, &partial).err();
        c.sink = Some(ReadSink {
            qp,
            header,
            sgl,
            pd,
            got: partial.len(),
            failed,
            purpose: SinkFor::ReadAnswer,
        });
    }

    /// When the frame being received is a large SEND and the QP's own receive queue has a
    /// receive for it, its payload is read from here on straight into that receive: a peer's
    /// message is never collected whole in a buffer of ours first (nor counted on the
    /// budget). The receive stays first in the queue until the message is in.
    pub(super) fn take_over_send(&mut self, sh: &Shared, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let Phase::Established { qp } = c.phase else {
            return;
        };
        let Some(h) = c.dec.pending() else { return };
        if h.kind != Kind::Send
            || (h.payload_len as usize) < wire::DIRECT_READ_MIN
            || !c.may_stream_send()
            || c.answers_pending() >= MAX_ANSWERS_PENDING
        {
            return;
        }
        let Some(e) = self.qps.get(&qp).filter(|e| streams_into(e)) else {
            return;
        };
        let Some(wr) = e.rq.front() else { return };
        let (sgl, wr_id, pd) = (wr.sgl.to_vec(), wr.wr_id, e.pd);
        let Some((header, partial)) = c.dec.take_pending() else {
            return;
        };
        let keys = sh.keys.read();
        let failed = match keys.check_local_sgl(&sgl, pd, true) {
            Err(s) => Some(s),
            Ok(room) if room < u64::from(header.payload_len) => Some(WcStatus::LocalLength),
            Ok(_) => keys.scatter(&sgl, pd, &partial).err(),
        };
        drop(keys);
        c.sink = Some(ReadSink {
            qp,
            header,
            sgl,
            pd,
            got: partial.len(),
            failed,
            purpose: SinkFor::Message { wr_id },
        });
        c.recharge();
    }

    /// When the frame being received is a large WRITE with nothing held before it, its
    /// payload is read from here on straight into the memory its rkey names (checked as each
    /// part arrives: a region freed meanwhile refuses the rest, which is read and dropped): a
    /// peer's write is never collected whole in a buffer of ours first (nor counted on the
    /// budget). Its ACK follows once it is all in (`sink_filled`).
    pub(super) fn take_over_write(&mut self, sh: &Shared, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let Phase::Established { qp } = c.phase else {
            return;
        };
        let Some(h) = c.dec.pending() else { return };
        if h.kind != Kind::Write
            || (h.payload_len as usize) < wire::DIRECT_READ_MIN
            || !c.may_stream_send()
        {
            return;
        }
        let Some(pd) = self.qps.get(&qp).map(|e| e.pd) else {
            return;
        };
        let Some((header, partial)) = c.dec.take_pending() else {
            return;
        };
        self.requests_served += 1;
        let failed = sh
            .keys
            .read()
            .remote_write_part(header.key, header.addr, header.payload_len, pd, 0, &partial)
            .err()
            .map(|_| WcStatus::RemoteAccess);
        c.sink = Some(ReadSink {
            qp,
            header,
            sgl: Vec::new(),
            pd,
            got: partial.len(),
            failed,
            purpose: SinkFor::Write,
        });
        c.recharge();
    }

    /// Reads connection `token`, whose peer writes its frames into our ring: first the
    /// socket if `socket` (doorbells are dropped, the end of stream noted), then the ring, and
    /// only when the ring is empty the end of stream, so that everything the peer wrote before
    /// it closed or died is served first.
    fn read_ring_conn(&mut self, sh: &Shared, token: u64, buf: &mut [u8], socket: bool) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let Some(ring) = c.same_host.reading_ring().cloned() else {
            return;
        };
        // Parked, its bell is in the parked set (readiness.rs `Parked`): rearmed before the
        // ring is read, so that a frame written after the read rings it again.
        if c.parked.is_some() {
            ring.drain_bell();
        }
        let mut ended = false;
        let mut doorbells = [0u8; 256];
        if socket {
            loop {
                match c.stream.read(&mut doorbells) {
                    Ok(0) => ended = true,
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => ended = true,
                }
                break;
            }
        }
        // The peer is gone: the rest of its frames are in the ring (bounded by its size),
        // read whatever is held, so that its end is reported after them.
        c.peer_closing |= ended;
        // As many reads as a socket gets (see read_conn_unguarded), unless the peer is gone.
        for round in 0.. {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            let closing = c.is_closing();
            if (!closing && !c.wants_input()) || (!ended && round == 64) {
                break;
            }
            match ring.read(buf) {
                Ok(n) => {
                    c.ring_read_at = Some(Instant::now());
                    if !closing {
                        c.dec.feed(&buf[..n]);
                    }
                    if ring.take_writer_waiting() {
                        self.ring_peer(token);
                    }
                    if !closing {
                        self.process_frames(sh, token);
                        if let Some(c) = self.conns.get_mut(&token) {
                            c.pace_input();
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.protocol_error(token, &e.to_string());
                    return;
                }
            }
        }
        // What we queued may have waited for room in the peer's ring (its doorbell).
        if self
            .conns
            .get(&token)
            .is_some_and(|c| !c.out.is_empty() && c.same_host.writing_ring().is_some())
        {
            self.try_write(token);
        }
        let Some(c) = self.conns.get(&token) else {
            return;
        };
        if !ended || (ring.has_data() && !c.is_closing()) {
            // Not ended, or frames still held back: the end of stream is read again later.
            return;
        }
        if c.is_closing() {
            self.conns.remove(&token);
        } else {
            self.peer_ended(token, PeerEnd::Lost);
        }
    }

    /// Receives more of the payload a `ReadSink` places; completes the read when all is in.
    pub(super) fn read_sink(&mut self, sh: &Shared, token: u64, buf: &mut [u8]) -> SinkStep {
        let Some(c) = self.conns.get_mut(&token) else {
            return SinkStep::Gone;
        };
        let Some(sink) = c.sink.as_mut() else {
            return SinkStep::More;
        };
        let total = sink.header.payload_len as usize;
        let want = total.saturating_sub(sink.got);
        let result = match sink.failed {
            None if want > 0 => {
                let fd = c.stream.as_raw_fd();
                let keys = sh.keys.read();
                let r = match sink.purpose {
                    SinkFor::Write => {
                        let h = &sink.header;
                        keys.recv_remote_write(h.key, h.addr, h.payload_len, sink.pd, sink.got, fd)
                    }
                    _ => keys.recv_into_sgl(&sink.sgl, sink.pd, sink.got, want, fd),
                };
                drop(keys);
                match r {
                    Ok(r) => r,
                    Err(status) => {
                        sink.failed = Some(status);
                        return SinkStep::More;
                    }
                }
            }
            _ => {
                let n = want.min(buf.len());
                c.stream.read(&mut buf[..n])
            }
        };
        match result {
            Ok(0) if want > 0 => {
                self.peer_ended(token, PeerEnd::Lost);
                SinkStep::Gone
            }
            Ok(n) => {
                sink.got += n;
                if sink.got >= total {
                    if let Some(s) = c.sink.take() {
                        self.sink_filled(sh, token, s);
                    }
                }
                SinkStep::More
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => SinkStep::Blocked,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => SinkStep::More,
            Err(_) => {
                self.peer_ended(token, PeerEnd::Lost);
                SinkStep::Gone
            }
        }
    }

    /// All of a sink's payload is in: what it was for completes.
    fn sink_filled(&mut self, sh: &Shared, token: u64, s: ReadSink) {
        let placed = s.failed.unwrap_or(WcStatus::Success);
        match s.purpose {
            SinkFor::ReadAnswer => self.response(sh, s.qp, &s.header, &[], Some(placed)),
            SinkFor::Write => {
                let r = match placed {
                    WcStatus::Success => Ok(()),
                    _ => Err(Status::RemoteAccess),
                };
                if let Outcome::Broken = self.ack_write(token, s.qp, &s.header, r) {
                    return;
                }
                self.try_write(token);
            }
            SinkFor::Message { wr_id } => {
                // The receive is still first in the queue (a flush would have ended the
                // connection, and this sink with it).
                let Some(e) = self.qps.get_mut(&s.qp) else {
                    return;
                };
                if e.rq.front().map(|w| w.wr_id) != Some(wr_id) {
                    return;
                }
                let Some(wr) = e.rq.pop_front() else {
                    return;
                };
                let len = s.header.payload_len as usize;
                let placed = if placed == WcStatus::Success {
                    Ok(())
                } else {
                    Err(placed)
                };
                if let Outcome::Broken =
                    self.message_received(sh, token, s.qp, &s.header, &wr, true, placed, len)
                {
                    return;
                }
                self.try_write(token);
            }
        }
    }
}

/// Whether a frame of `kind` may arrive on a connection in `phase`; any other breaks the
/// connection on its header, before its payload is read (a peer cannot make a connection that
/// has not been accepted buffer a 16 MiB SEND).
fn allowed_in(phase: Phase, kind: Kind) -> bool {
    match phase {
        Phase::PassiveAwaitHello { .. } => kind == Kind::Hello,
        // The consumer has not answered yet: the peer has nothing to say meanwhile.
        Phase::PassiveRequested { .. } | Phase::PassiveUdRequested { .. } => false,
        Phase::ActiveAwaitReply { .. } | Phase::UdAwaitReply { .. } => {
            matches!(kind, Kind::Accept | Kind::Reject)
        }
        Phase::Established { .. } => !matches!(kind, Kind::Hello | Kind::Accept | Kind::Reject),
        Phase::Closing => true,
    }
}

/// The QP of an established connection's phase (0, no QP, otherwise).
fn qp_of(phase: Phase) -> u32 {
    match phase {
        Phase::Established { qp } => qp,
        _ => 0,
    }
}

/// Whether a large SEND on `e`'s connection may go straight into its next receive: the QP's
/// own queue has one (a shared queue's receives are taken by any of its QPs meanwhile), and no
/// receive window is published to a same-host peer (whose slots count the queue's receives).
fn streams_into(e: &QpEntry) -> bool {
    e.srq.is_none() && e.recv_window.is_none() && !e.rq.is_empty()
}
