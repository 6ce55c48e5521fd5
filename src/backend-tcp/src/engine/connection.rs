//! Connections of the TCP transport: the active side's connect and HELLO, the passive side's
//! listeners, accept and reject, orderly and abrupt disconnects, deadlines, and what a lost or
//! misbehaving peer does to its connection.

use super::*;

impl Engine {
    // ---- connection management -----------------------------------------------------------------

    pub(crate) fn begin_connect(
        &mut self,
        qp: u32,
        remote: SocketAddrV4,
        hello: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        let e = self.qps.get_mut(&qp).ok_or_else(bad_state)?;
        if e.state != QpState::Init {
            return Err(bad_state());
        }
        e.state = QpState::Connecting;
        e.attempt += 1;
        e.hello = hello;
        e.remote = Some(remote);
        e.deadline = timeout.map(|t| Instant::now() + t);
        Ok(e.attempt)
    }

    /// The consumer's connect of `qp` (its `attempt`) started: done at once, failed, or under
    /// way until `until` (then the progress thread watches the socket: `connects_to_watch`).
    pub(crate) fn connect_started(
        &mut self,
        qp: u32,
        attempt: u64,
        started: io::Result<(TcpStream, bool)>,
        until: Instant,
    ) {
        self.wake_needed = true;
        match started {
            Ok((stream, false)) => {
                let c = Connecting {
                    attempt,
                    stream,
                    until,
                };
                self.connecting.insert(qp, c);
            }
            Ok((stream, true)) => self.connect_results.push((qp, attempt, Ok(stream))),
            Err(e) => self.connect_results.push((qp, attempt, Err(e))),
        }
    }

    /// The sockets of the connects under way, for the progress thread to watch for their end
    /// (writable), and the time left to the first one's limit.
    pub(super) fn connects_to_watch(
        &self,
        now: Instant,
    ) -> (Vec<(u32, std::os::fd::RawFd)>, Option<Duration>) {
        let first = self.connecting.values().map(|c| c.until).min();
        let fds = self
            .connecting
            .iter()
            .map(|(qp, c)| (*qp, c.stream.as_raw_fd()))
            .collect();
        (fds, first.map(|u| u.saturating_duration_since(now)))
    }

    /// The connect of `qp` ended (its socket is writable) or may have run out of time: its
    /// result goes to `process_connect_results`.
    pub(super) fn connect_ended(&mut self, qp: u32, now: Instant, ready: bool) {
        let Some(c) = self.connecting.get(&qp) else {
            return;
        };
        let result = match c.stream.take_error() {
            Ok(None) if ready => Ok(()),
            Ok(None) if now < c.until => return, // still under way
            Ok(None) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection timed out",
            )),
            Ok(Some(e)) | Err(e) => Err(e),
        };
        let Some(c) = self.connecting.remove(&qp) else {
            return;
        };
        let result = result.map(|()| c.stream);
        self.connect_results.push((qp, c.attempt, result));
    }

    /// Connects under way past their limit end as timed out.
    pub(super) fn expire_connects(&mut self, now: Instant) {
        let expired: Vec<u32> = self
            .connecting
            .iter()
            .filter(|(_, c)| c.until <= now)
            .map(|(qp, _)| *qp)
            .collect();
        for qp in expired {
            self.connect_ended(qp, now, false);
        }
    }

    pub(super) fn process_connect_results(&mut self) {
        for (qp, attempt, result) in std::mem::take(&mut self.connect_results) {
            let current = match self.qps.get(&qp) {
                Some(e) => {
                    e.state == QpState::Connecting && e.attempt == attempt && e.conn.is_none()
                }
                None => false,
            };
            if !current {
                continue; // disconnected or destroyed meanwhile; the socket just closes
            }
            match result {
                Ok(stream) => {
                    if stream.set_nonblocking(true).is_err() {
                        self.fail_qp(qp, Some(CmEvent::Unreachable { qp_num: qp }));
                        continue;
                    }
                    tune(&stream);
                    let token = self.token();
                    let (local, remote) = (v4(stream.local_addr()), v4(stream.peer_addr()));
                    let Some(e) = self.qps.get_mut(&qp) else {
                        continue;
                    };
                    e.conn = Some(token);
                    e.local = local;
                    if remote.is_some() {
                        e.remote = remote;
                    }
                    let hello = std::mem::take(&mut e.hello);
                    let deadline = e.deadline;
                    let charge = Charge::new(self.peer_memory.clone());
                    let mut conn =
                        Conn::new(stream, Phase::ActiveAwaitReply { qp }, deadline, charge);
                    let mut h = wire::handshake(Kind::Hello);
                    if self.same_host_hello {
                        h.flags |= wire::FLAG_SAME_HOST;
                    }
                    conn.out.push_frame(h, hello);
                    self.conns.insert(token, conn);
                    self.try_write(token);
                }
                Err(err) => {
                    // Refusals show up as ConnectionRefused or, when the refusal races
                    // connect_timeout's poll, as an uncategorised error: both are "nobody
                    // listens there" (NON_PEER_REJECTED). Only routing failures are UNREACHABLE.
                    let ev = match err.kind() {
                        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                            CmEvent::TimedOut { qp_num: qp }
                        }
                        io::ErrorKind::HostUnreachable
                        | io::ErrorKind::NetworkUnreachable
                        | io::ErrorKind::AddrNotAvailable
                        | io::ErrorKind::NetworkDown => CmEvent::Unreachable { qp_num: qp },
                        _ => CmEvent::rejected_not_by_peer(qp),
                    };
                    self.fail_qp(qp, Some(ev));
                }
            }
        }
    }

    pub(crate) fn accept(
        &mut self,
        sh: &Shared,
        req: u64,
        qp: u32,
        private_data: &[u8],
    ) -> Result<()> {
        match self.qps.get(&qp) {
            Some(e) if e.state == QpState::Init => {}
            _ => return Err(bad_state()),
        }
        let requested = matches!(
            self.conns.get(&req).map(|c| c.phase),
            Some(Phase::PassiveRequested { .. })
        );
        if !requested {
            // The requester went away: the accept "completes" as a broken connection.
            if let Some(e) = self.qps.get_mut(&qp) {
                e.state = QpState::Connecting;
            }
            self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
            return Ok(());
        }
        let flags = match self.same_host_accept_flags(sh, req) {
            Ok(flags) => flags,
            Err(why) => {
                log::error!(target: super::super::samehost::LOG, "qp {qp}: DAPLRS_SAME_HOST=require, but {why}: refusing the connection");
                if let Some(c) = self.conns.get_mut(&req) {
                    c.out.push_frame(Header::new(Kind::Reject), Vec::new());
                    c.begin_close();
                }
                self.try_write(req);
                if let Some(e) = self.qps.get_mut(&qp) {
                    e.state = QpState::Connecting;
                }
                self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
                return Ok(());
            }
        };
        let Some(c) = self.conns.get_mut(&req) else {
            return Err(bad_state());
        };
        let (local, remote) = (v4(c.stream.local_addr()), v4(c.stream.peer_addr()));
        c.phase = Phase::Established { qp };
        c.arm_signal();
        let mut h = wire::handshake(Kind::Accept);
        h.flags = flags;
        c.out.push_frame(h, private_data.to_vec());
        if let Some(e) = self.qps.get_mut(&qp) {
            e.state = QpState::Connected;
            e.conn = Some(req);
            e.local = local;
            e.remote = remote;
        }
        if flags & wire::FLAG_SAME_HOST != 0 {
            self.same_host_agreed(sh, req, qp);
        }
        self.rewatch(req);
        self.emit(CmEvent::Established {
            qp_num: qp,
            private_data: Vec::new(),
        });
        self.try_write(req);
        self.wake_needed = true;
        Ok(())
    }

    pub(crate) fn reject(&mut self, _sh: &Shared, req: u64, private_data: &[u8]) -> Result<()> {
        let Some(c) = self.conns.get_mut(&req) else {
            return Ok(());
        };
        if !matches!(
            c.phase,
            Phase::PassiveRequested { .. }
                | Phase::PassiveUdRequested { .. }
                | Phase::PassiveAwaitHello { .. }
        ) {
            return Err(bad_state());
        }
        c.out
            .push_frame(Header::new(Kind::Reject), private_data.to_vec());
        c.begin_close();
        self.try_write(req);
        Ok(())
    }

    pub(crate) fn disconnect(&mut self, _sh: &Shared, qp: u32, abrupt: bool) -> Result<()> {
        let Some(e) = self.qps.get_mut(&qp) else {
            return Err(bad_state());
        };
        match e.state {
            QpState::Connecting => {
                self.fail_qp(qp, Some(CmEvent::Disconnected { qp_num: qp }));
            }
            QpState::Connected => {
                if abrupt || (e.outstanding.is_empty() && e.fenced.is_empty()) {
                    self.finish_disconnect(qp);
                } else {
                    e.graceful_pending = true;
                }
            }
            QpState::Init | QpState::Error => {}
        }
        Ok(())
    }

    pub(super) fn finish_disconnect(&mut self, qp: u32) {
        let Some(e) = self.qps.get_mut(&qp) else {
            return;
        };
        e.state = QpState::Error;
        e.graceful_pending = false;
        if let Some(t) = e.conn.take() {
            self.goodbye(t);
        }
        self.flush_qp(qp);
        self.emit(CmEvent::Disconnected { qp_num: qp });
    }

    pub(crate) fn shutdown(&mut self, _sh: &Shared) {
        let qps: Vec<u32> = self.qps.keys().copied().collect();
        for qp in qps {
            if let Some(e) = self.qps.get_mut(&qp) {
                e.state = QpState::Error;
                e.conn = None;
            }
            self.flush_qp(qp);
        }
        let tokens: Vec<u64> = self.conns.keys().copied().collect();
        for t in tokens {
            self.goodbye(t);
        }
        for c in self.conns.values() {
            // The DISCONNECTs just queued reach the peers (`liveness::reset_on_exit`).
            let _ = sys::set_abortive_close(c.stream.as_raw_fd(), false);
        }
        self.conns.clear();
        self.listeners.clear();
    }

    /// The peer broke the protocol: its connection (only) goes.
    pub(super) fn protocol_error(&mut self, token: u64, why: &str) {
        log::warn!("connection {token}: protocol error: {why}");
        let Some(c) = self.conns.get(&token) else {
            return;
        };
        match c.phase {
            Phase::Established { qp } => self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp })),
            Phase::ActiveAwaitReply { qp } => {
                self.fail_qp(qp, Some(CmEvent::rejected_not_by_peer(qp)))
            }
            Phase::PassiveRequested { listener } | Phase::PassiveUdRequested { listener, .. } => {
                self.conns.remove(&token);
                self.emit(CmEvent::RequestCancelled {
                    listener,
                    req: token,
                });
            }
            Phase::UdAwaitReply { id } => {
                self.conns.remove(&token);
                self.ud_failed(id, false, Vec::new());
            }
            Phase::PassiveAwaitHello { .. } => {
                // Tell a peer of another version why, then close.
                if let Some(c) = self.conns.get_mut(&token) {
                    let mut h = Header::new(Kind::Reject);
                    h.status = Status::BadVersion;
                    c.out.push_frame(h, Vec::new());
                    c.begin_close();
                }
                self.try_write(token);
            }
            Phase::Closing => {
                self.conns.remove(&token);
            }
        }
    }

    /// The connection ended without a goodbye (EOF or socket error).
    pub(super) fn conn_lost(&mut self, token: u64) {
        let Some(c) = self.conns.remove(&token) else {
            return;
        };
        match c.phase {
            Phase::Established { qp } => {
                if let Some(e) = self.qps.get_mut(&qp) {
                    e.conn = None;
                }
                self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
            }
            Phase::ActiveAwaitReply { qp } => {
                if let Some(e) = self.qps.get_mut(&qp) {
                    e.conn = None;
                }
                self.fail_qp(qp, Some(CmEvent::rejected_not_by_peer(qp)));
            }
            Phase::PassiveRequested { listener } | Phase::PassiveUdRequested { listener, .. } => {
                self.emit(CmEvent::RequestCancelled {
                    listener,
                    req: token,
                });
            }
            Phase::UdAwaitReply { id } => self.ud_failed(id, false, Vec::new()),
            Phase::PassiveAwaitHello { .. } | Phase::Closing => {}
        }
    }

    /// The peer's stream ended (`PeerEnd::Lost`) or it said DISCONNECT. With messages held,
    /// the end is reported once the consumer has received them, or at END_GRACE; meanwhile
    /// nothing more is read. Without, at once.
    pub(super) fn peer_ended(&mut self, token: u64, how: PeerEnd) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if c.held.is_empty() || !matches!(c.phase, Phase::Established { .. }) {
            self.report_peer_end(token, how);
            return;
        }
        if c.peer_end.is_none() {
            log::info!(
                "connection {token}: the peer ended with {} messages held; they wait {END_GRACE:?} for receives",
                c.held.len()
            );
            c.peer_end = Some(how);
            c.deadline = Some(Instant::now() + END_GRACE);
        }
    }

    /// Reports the end of a connection whose peer ended (`peer_ended`): what is still held is
    /// dropped (the peer's sends never completed, as a flushed send does not).
    pub(super) fn report_peer_end(&mut self, token: u64, how: PeerEnd) {
        if let Some(c) = self.conns.get(&token) {
            if !c.held.is_empty() {
                log::info!(
                    "connection {token}: {} messages held past the peer's end were not received",
                    c.held.len()
                );
            }
        }
        match (how, self.conns.get(&token).map(|c| c.phase)) {
            (PeerEnd::Disconnect, Some(Phase::Established { qp })) => {
                self.conns.remove(&token);
                if let Some(e) = self.qps.get_mut(&qp) {
                    e.conn = None;
                }
                self.fail_qp(qp, Some(CmEvent::Disconnected { qp_num: qp }));
            }
            _ => self.conn_lost(token),
        }
    }

    /// Drops a connection at once, without a word to the peer: what a lost peer does to it.
    pub(super) fn drop_conn(&mut self, token: u64) {
        self.conn_lost(token);
    }

    /// Connections of `listener` still awaiting their HELLO: past MAX_AWAITING_HELLO, the
    /// oldest are dropped to make room for `token`.
    fn admit_awaiting_hello(&mut self, listener: u64, token: u64) {
        let listeners = &self.listeners;
        self.awaiting_hello.retain(|l, _| listeners.contains_key(l));
        self.accept_paused.retain(|l, _| listeners.contains_key(l));
        let mut queue = self.awaiting_hello.remove(&listener).unwrap_or_default();
        if queue.len() >= MAX_AWAITING_HELLO {
            let conns = &self.conns;
            queue.retain(|t| {
                conns
                    .get(t)
                    .is_some_and(|c| matches!(c.phase, Phase::PassiveAwaitHello { .. }))
            });
        }
        while queue.len() >= MAX_AWAITING_HELLO {
            if let Some(oldest) = queue.pop_front() {
                log::info!(
                    "listener {listener}: too many connections without HELLO; dropping the oldest"
                );
                self.conns.remove(&oldest);
            }
        }
        queue.push_back(token);
        self.awaiting_hello.insert(listener, queue);
    }

    /// Whether `listener` may take one more connection request (see MAX_PENDING_REQUESTS).
    pub(super) fn request_room(&self, listener: u64) -> bool {
        let pending = self
            .conns
            .values()
            .filter(|c| {
                matches!(c.phase,
                    Phase::PassiveRequested { listener: l } | Phase::PassiveUdRequested { listener: l, .. }
                    if l == listener)
            })
            .count();
        pending < MAX_PENDING_REQUESTS
    }

    pub(super) fn accept_incoming(&mut self, listener: u64) {
        for _ in 0..64 {
            let Some(l) = self.listeners.get(&listener) else {
                return;
            };
            match l.sock.accept() {
                Ok((stream, _)) => {
                    if self.accept_paused.remove(&listener).is_some() {
                        log::info!("accept on listener {listener}: resumed");
                    }
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    tune(&stream);
                    let token = self.token();
                    self.admit_awaiting_hello(listener, token);
                    let charge = self.charge();
                    self.conns.insert(
                        token,
                        Conn::new(
                            stream,
                            Phase::PassiveAwaitHello { listener },
                            Some(Instant::now() + HELLO_TIMEOUT),
                            charge,
                        ),
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    // Out of descriptors: the connection stays in the kernel's queue, and the
                    // listener would poll readable at once, forever (a busy loop). Rest it.
                    if !self.accept_paused.contains_key(&listener) {
                        log::warn!("accept on listener {listener}: {e}; pausing it");
                    }
                    self.accept_paused
                        .insert(listener, Instant::now() + ACCEPT_PAUSE);
                    return;
                }
                Err(e) => {
                    log::warn!("accept on listener {listener}: {e}");
                    return;
                }
            }
        }
    }

    pub(super) fn check_deadlines(&mut self) {
        let now = Instant::now();
        // A walk of every connection and QP: at most once a grain, not at every wake-up of
        // the progress thread (thousands a second while connections are set up).
        if self
            .deadlines_checked
            .is_some_and(|at| now < at + DEADLINE_GRAIN)
        {
            return;
        }
        self.deadlines_checked = Some(now);
        let expired_conns: Vec<(u64, Phase, Option<PeerEnd>)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.map(|d| d <= now).unwrap_or(false))
            .map(|(t, c)| (*t, c.phase, c.peer_end))
            .collect();
        for (t, phase, peer_end) in expired_conns {
            match (phase, peer_end) {
                (Phase::ActiveAwaitReply { qp }, _) => {
                    self.fail_qp(qp, Some(CmEvent::TimedOut { qp_num: qp }));
                }
                (_, Some(how)) => self.report_peer_end(t, how),
                _ => {
                    self.conns.remove(&t);
                }
            }
        }
        self.check_ud_deadlines(now);
        let expired_qps: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, e)| {
                e.state == QpState::Connecting && e.deadline.map(|d| d <= now).unwrap_or(false)
            })
            .map(|(n, _)| *n)
            .collect();
        for qp in expired_qps {
            self.fail_qp(qp, Some(CmEvent::TimedOut { qp_num: qp }));
        }
    }
}

/// How late a connection's or a connect's deadline may be noticed: its timeouts are
/// milliseconds to seconds.
const DEADLINE_GRAIN: Duration = Duration::from_millis(2);

/// A connect under way (`Engine::connect_started`).
pub(super) struct Connecting {
    attempt: u64,
    stream: TcpStream,
    until: Instant,
}
