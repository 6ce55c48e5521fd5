//! Socket I/O of the TCP transport: reading and decoding frames (and placing large read
//! answers straight into registered memory), writing queued output, and the progress
//! thread's poll loop.

use super::*;

impl Engine {
    pub(super) fn process_frames(&mut self, sh: &Shared, token: u64) {
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            let phase = c.phase;
            let frame = match c.dec.next_frame(&sh.limits) {
                Ok(Some(f)) => f,
                Ok(None) => return,
                Err(err) => {
                    self.protocol_error(token, &format!("{err:?}"));
                    return;
                }
            };
            let (h, p) = frame;
            match phase {
                Phase::Closing => {}
                Phase::PassiveAwaitHello { listener } => {
                    if h.kind != Kind::Hello {
                        self.protocol_error(token, "expected HELLO");
                        return;
                    }
                    let Some(c) = self.conns.get_mut(&token) else {
                        return;
                    };
                    let ud = h.flags & wire::FLAG_UD != 0;
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
                            return;
                        }
                    }
                }
                Phase::PassiveRequested { .. } | Phase::PassiveUdRequested { .. } => {
                    self.protocol_error(token, "data before accept");
                    return;
                }
                Phase::UdAwaitReply { id } => self.ud_reply(token, id, &h, p),
                Phase::ActiveAwaitReply { qp } => match h.kind {
                    Kind::Accept => {
                        if let Some(c) = self.conns.get_mut(&token) {
                            c.phase = Phase::Established { qp };
                            c.deadline = None;
                        }
                        if let Some(e) = self.qps.get_mut(&qp) {
                            e.state = QpState::Connected;
                            e.deadline = None;
                        }
                        self.emit(CmEvent::Established {
                            qp_num: qp,
                            private_data: p,
                        });
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
                        return;
                    }
                    _ => {
                        self.protocol_error(token, "expected ACCEPT or REJECT");
                        return;
                    }
                },
                Phase::Established { qp } => match h.kind {
                    Kind::Send | Kind::Write | Kind::ReadReq | Kind::WriteImm | Kind::Atomic => {
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
                                    c.held_bytes += p.len();
                                    c.held.push_back((h, p));
                                }
                            }
                            Outcome::Broken => return,
                        }
                        self.try_write(token);
                    }
                    Kind::Ack | Kind::ReadResp => self.response(sh, qp, &h, &p, None),
                    Kind::Disconnect => {
                        self.conns.remove(&token);
                        if let Some(e) = self.qps.get_mut(&qp) {
                            e.conn = None;
                        }
                        self.fail_qp(qp, Some(CmEvent::Disconnected { qp_num: qp }));
                        return;
                    }
                    _ => {
                        self.protocol_error(token, "handshake frame on an established connection");
                        return;
                    }
                },
            }
        }
    }

    /// Writes what the socket takes now; the progress thread writes the rest.
    pub(crate) fn try_write(&mut self, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if c.write_failed || c.draining {
            return;
        }
        match c.flush_out() {
            Ok(()) => {
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

    pub(crate) fn read_conn(&mut self, sh: &Shared, token: u64, buf: &mut [u8]) {
        for _ in 0..64 {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
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
            if c.held_bytes > HOLD_LIMIT {
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
                    self.conn_lost(token);
                    return;
                }
                Ok((n, direct)) => {
                    if !direct {
                        c.dec.feed(&buf[..n]);
                    }
                    self.process_frames(sh, token);
                    self.take_over_read(sh, token);
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
                    self.conn_lost(token);
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
        let failed = sh.keys.lock().scatter(&sgl, pd, &partial).err();
        c.sink = Some(ReadSink {
            qp,
            header,
            sgl,
            pd,
            got: partial.len(),
            failed,
        });
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
                let r = sh.keys.lock().recv_into_sgl(
                    &sink.sgl,
                    sink.pd,
                    sink.got,
                    want,
                    c.stream.as_raw_fd(),
                );
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
                self.conn_lost(token);
                SinkStep::Gone
            }
            Ok(n) => {
                sink.got += n;
                if sink.got >= total {
                    if let Some(s) = c.sink.take() {
                        let placed = s.failed.unwrap_or(WcStatus::Success);
                        self.response(sh, s.qp, &s.header, &[], Some(placed));
                    }
                }
                SinkStep::More
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => SinkStep::Blocked,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => SinkStep::More,
            Err(_) => {
                self.conn_lost(token);
                SinkStep::Gone
            }
        }
    }
}

enum Target {
    Wake,
    Listener(u64),
    Conn(u64),
    /// A datagram QP's socket.
    Datagram(u32),
}

/// The progress thread: polls the wake-up pipe, listeners and connections until the device
/// closes.
pub(crate) fn progress_loop(shared: Arc<Shared>) {
    let mut buf = vec![0u8; 256 * 1024];
    let mut drain = [0u8; 256];
    loop {
        if shared.stopped.load(Ordering::SeqCst) {
            break;
        }
        let (mut fds, targets) = {
            let mut eng = shared.engine.lock();
            // Connections a waiting application thread drives are left out; the first one it
            // gives back wakes us (`release_claims`).
            let mut excluding = false;
            let mut fds = vec![PollFd::new(shared.wake_rx.as_raw_fd(), POLLIN)];
            let mut targets = vec![Target::Wake];
            for (id, l) in &eng.listeners {
                fds.push(PollFd::new(l.sock.as_raw_fd(), POLLIN));
                targets.push(Target::Listener(*id));
            }
            for (t, c) in &eng.conns {
                if c.driven.is_some() {
                    excluding = true;
                    continue;
                }
                let mut ev = 0;
                if c.held_bytes <= HOLD_LIMIT {
                    ev |= POLLIN;
                }
                if !c.out.is_empty() && !c.write_failed && !c.draining {
                    ev |= POLLOUT;
                }
                if ev == 0 {
                    // Back-pressured and nothing to send: leave it out entirely, since poll
                    // reports hang-ups even for no events and we would spin on them.
                    continue;
                }
                fds.push(PollFd::new(c.stream.as_raw_fd(), ev));
                targets.push(Target::Conn(*t));
            }
            for (qp, fd, output) in eng.ud_sockets() {
                fds.push(PollFd::new(
                    fd,
                    if output { POLLIN | POLLOUT } else { POLLIN },
                ));
                targets.push(Target::Datagram(qp));
            }
            eng.poll_excludes = excluding;
            (fds, targets)
        };
        if let Err(e) = sys::poll(&mut fds, TICK_MS) {
            log::error!("poll failed: {e}");
            std::thread::sleep(Duration::from_millis(TICK_MS as u64));
        }
        if fds[0].revents() != 0 {
            while let Ok(n) = (&shared.wake_rx).read(&mut drain) {
                if n == 0 {
                    break;
                }
            }
        }
        if shared.stopped.load(Ordering::SeqCst) {
            break;
        }
        shared.run(|eng, sh| {
            eng.process_connect_results();
            eng.process_ud_connect_results();
            for (fd, target) in fds.iter().zip(targets.iter()) {
                let rev = fd.revents();
                if rev == 0 {
                    continue;
                }
                match target {
                    Target::Wake => {}
                    Target::Listener(id) => eng.accept_incoming(*id),
                    Target::Conn(t) => {
                        if rev & (POLLIN | POLLHUP | POLLERR | POLLNVAL) != 0 {
                            eng.read_conn(sh, *t, &mut buf);
                        }
                        if rev & POLLOUT != 0 {
                            eng.try_write(*t);
                        }
                    }
                    Target::Datagram(qp) => {
                        if rev & (POLLIN | POLLERR) != 0 {
                            eng.read_ud(sh, *qp, &mut buf);
                        }
                        if rev & POLLOUT != 0 {
                            eng.flush_ud(*qp);
                        }
                    }
                }
            }
            eng.retry_drained(sh);
            eng.settle_failed_writes(sh, &mut buf);
            eng.check_deadlines();
            // Wake-ups requested by our own work are already served by the next iteration.
            eng.wake_needed = false;
        });
    }
}
