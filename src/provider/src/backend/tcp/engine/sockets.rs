//! Socket I/O of the TCP transport: reading and decoding frames (and placing large read
//! answers straight into registered memory), writing queued output, and the progress
//! thread's poll loop.

use super::super::samehost::ring::Ring;
use super::*;

impl Engine {
    pub(super) fn process_frames(&mut self, sh: &Shared, token: u64) {
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            let phase = c.phase;
            let frame = match c
                .dec
                .next_frame_if(&sh.limits, |h| allowed_in(phase, h.kind))
            {
                Ok(Some(f)) => f,
                Ok(None) => return,
                Err(err) => {
                    self.protocol_error(token, &format!("{err:?}"));
                    return;
                }
            };
            self.frames_served += 1;
            let (h, p) = frame;
            match phase {
                Phase::Closing => {}
                Phase::PassiveAwaitHello { listener } => {
                    if h.kind != Kind::Hello {
                        self.protocol_error(token, "expected HELLO");
                        return;
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
                        return;
                    }
                    let Some(c) = self.conns.get_mut(&token) else {
                        return;
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
                        if !self.same_host_accepted(sh, token, qp, h.flags) {
                            return;
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
                                    c.held_bytes += held_cost(&p);
                                    c.held.push_back((h, p));
                                }
                            }
                            Outcome::Broken => return,
                        }
                        self.try_write(token);
                    }
                    Kind::Ack | Kind::ReadResp => self.response(sh, qp, &h, &p, None),
                    Kind::SameHost => self.same_host_offer(sh, token, qp, &p),
                    Kind::Switch => {
                        if !self.same_host_switch(sh, token) {
                            return;
                        }
                    }
                    // Our ring has room again for what we queued.
                    Kind::Doorbell => self.try_write(token),
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
                    self.conn_lost(token);
                    return;
                }
                Ok((n, direct)) => {
                    if !direct {
                        c.dec.feed(&buf[..n]);
                    }
                    self.process_frames(sh, token);
                    self.take_over_read(sh, token);
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
                    if !closing {
                        c.dec.feed(&buf[..n]);
                    }
                    if ring.take_writer_waiting() {
                        self.ring_peer(token);
                    }
                    if !closing {
                        self.process_frames(sh, token);
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
            self.conn_lost(token);
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
    let spin = spin_window();
    // When this thread last served traffic: for a spin window after it, it polls without
    // sleeping (see `spin_window`).
    let mut last_traffic: Option<Instant> = None;
    loop {
        if shared.stopped.load(Ordering::SeqCst) {
            break;
        }
        let (mut fds, targets, rings, lease_end) = {
            let mut eng = shared.engine.lock();
            let mut rings = RingWatch::default();
            let mut lease_end: Option<Duration> = None;
            // Connections a waiting application thread drives are left out; the first one it
            // gives back wakes us (`release_claims`). Those a polling consumer reads
            // (`TcpCq::progress`) stay in: keeping us off them for a while after each poll
            // (a lease, tried) made an application that polls memory for a peer's RDMA write,
            // not its EVD, wait for the lease to run out (8 B write ping-pong over veth: 170
            // us one-way with a 200 us lease, 16-22 us without). On a same-host ring we only
            // stop counting ourselves as a sleeper for a while (`POLL_LEASE`).
            let mut excluding = false;
            let mut fds = vec![PollFd::new(shared.wake_rx.as_raw_fd(), POLLIN)];
            let mut targets = vec![Target::Wake];
            let now = Instant::now();
            for (id, l) in &eng.listeners {
                if eng.accept_paused.get(id).is_some_and(|until| *until > now) {
                    continue; // out of descriptors: see `accept_incoming`
                }
                fds.push(PollFd::new(l.sock.as_raw_fd(), POLLIN));
                targets.push(Target::Listener(*id));
            }
            for (t, c) in &eng.conns {
                if c.driven.is_some() {
                    excluding = true;
                    continue;
                }
                let mut ev = 0;
                if c.wants_input() {
                    ev |= POLLIN;
                }
                // Output for the peer's same-host ring waits for room there, not in the socket
                // (the reader's doorbell says when there is room again).
                let output = !c.out.is_empty() && !c.write_failed && !c.draining;
                let ring_out = c.same_host.writing_ring().filter(|_| output);
                if output && ring_out.is_none() {
                    ev |= POLLOUT;
                }
                if ev == 0 && ring_out.is_none() {
                    // Back-pressured and nothing to send: leave it out entirely, since poll
                    // reports hang-ups even for no events and we would spin on them.
                    continue;
                }
                // Our ring from when we offered it, switched to or not (see `Claim::ring`).
                if let Some(ring) = c.same_host.incoming.as_ref().filter(|_| ev & POLLIN != 0) {
                    match c
                        .poll_lease
                        .and_then(|until| until.checked_duration_since(now))
                    {
                        // Left to its poller: no doorbell for us; back when the lease ends.
                        Some(left) => lease_end = Some(lease_end.map_or(left, |l| l.min(left))),
                        None => rings.watch_input(fds.len(), ring),
                    }
                }
                if let Some(ring) = ring_out {
                    rings.watch_output(fds.len(), ring);
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
            rings.add_bells(&mut fds);
            (fds, targets, rings, lease_end)
        };
        // Back when the first poll lease ends, to watch what it left to its poller again.
        let tick = Duration::from_millis(TICK_MS as u64);
        let timeout = lease_end.map_or(tick, |l| l.min(tick));
        let spin_until = last_traffic.map(|t| t + spin);
        let polled = match spin_until {
            _ if rings.begin() => sys::poll(&mut fds, 0),
            Some(until) if !spin.is_zero() => spin_poll(&mut fds, until, timeout, true),
            _ => sys::poll_for(&mut fds, timeout),
        };
        rings.end(&mut fds);
        if let Err(e) = polled {
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
        // A panic not caught around one connection (a bug) costs this iteration's work, not
        // the thread: every other connection of the IA is still served.
        let iteration = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            shared.run(|eng, sh| {
                let frames_before = eng.frames_served;
                let mut traffic = false;
                eng.process_connect_results();
                eng.process_ud_connect_results();
                for (fd, target) in fds.iter().zip(targets.iter()) {
                    let rev = fd.revents();
                    if rev == 0 {
                        continue;
                    }
                    match target {
                        Target::Wake => {}
                        Target::Listener(id) => {
                            traffic = true;
                            eng.accept_incoming(*id)
                        }
                        Target::Conn(t) => {
                            if rev & (POLLIN | POLLHUP | POLLERR | POLLNVAL) != 0 {
                                eng.read_conn(sh, *t, &mut buf);
                            }
                            if rev & POLLOUT != 0 {
                                eng.try_write(*t);
                            }
                        }
                        Target::Datagram(qp) => {
                            traffic = true;
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
                // Spin after serving something only: a socket that woke us but whose frames
                // an application thread read first (it drives or polls it) is no reason to
                // keep a CPU busy; spinning then only takes that CPU from the applications.
                traffic || eng.frames_served != frames_before
            })
        }));
        match iteration {
            Ok(true) => last_traffic = Some(Instant::now()),
            Ok(false) => {}
            Err(_) => {
                log::error!("progress thread: panic caught; serving on");
                shared.engine.lock().panics += 1;
            }
        }
    }
}

// ---- spinning before sleeping -----------------------------------------------------------------

/// Environment variable: how long, in microseconds, a thread that just saw traffic (the
/// progress thread after serving a request, an application thread waiting in `dat_evd_wait`)
/// polls its sockets without sleeping before it blocks; 0 turns spinning off.
pub(crate) const SPIN_ENV: &str = "DAPLRS_SPIN_US";
/// The spin window when the variable is unset: a few loopback or LAN round trips. Sleeping
/// costs a wake-up when the next frame comes (tens of microseconds for an idle CPU of a
/// virtual machine), which is what a request-answer exchange would otherwise pay on each side.
pub(crate) const SPIN_DEFAULT_US: u64 = 50;

/// The spin window in effect (`DAPLRS_SPIN_US`, read once per process; at most 10 ms).
pub(crate) fn spin_window() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| parse_spin(std::env::var(SPIN_ENV).ok().as_deref()))
}

pub(crate) fn parse_spin(value: Option<&str>) -> Duration {
    let Some(v) = value else {
        return Duration::from_micros(SPIN_DEFAULT_US);
    };
    match v.trim().parse::<u64>() {
        Ok(us) if us <= 10_000 => Duration::from_micros(us),
        _ => {
            log::warn!("{SPIN_ENV}={v:?} is not a number of microseconds (0..=10000); using {SPIN_DEFAULT_US}");
            Duration::from_micros(SPIN_DEFAULT_US)
        }
    }
}

/// How long after a polling consumer's last look at a same-host connection (`TcpCq::progress`)
/// the progress thread leaves its ring to that consumer: it does not count itself a sleeper
/// there (see `RingWatch`), so the peer rings no doorbell and its messages wake nobody; a
/// consumer polling in a loop looks again within microseconds. When the consumer stops
/// polling, what arrives waits at most this long. (Over TCP the kernel wakes whoever polls a
/// socket: keeping the progress thread off polled sockets this way, tried with 100 and 200
/// us, made an application that polls its memory for a peer's RDMA write wait for the lease,
/// and polled reads were no faster on 2 CPUs; so over TCP it keeps watching.)
pub(crate) const POLL_LEASE: Duration = Duration::from_micros(100);

impl Engine {
    /// A polling consumer reads connection `token` now and will again soon. Only a same-host
    /// connection's lease is ever looked at: a TCP one costs no clock reading.
    pub(crate) fn note_poller(&mut self, token: u64) {
        if let Some(c) = self
            .conns
            .get_mut(&token)
            .filter(|c| c.same_host.incoming.is_some())
        {
            c.poll_lease = Some(Instant::now() + POLL_LEASE);
        }
    }
}

/// The same-host rings (samehost/ring.rs) of connections in a poll set, by their index in the
/// set: rings we read (the peer's frames) and rings we write (the peer's ring, while output
/// waits). A thread that may sleep in poll counts itself on each ring it reads first, so that
/// the peer's writes ring the doorbell on the socket, and does not sleep if a ring it reads
/// holds data or a ring it writes has room: the socket's POLLIN and POLLOUT stand for those.
///
/// The progress thread does not count itself on a ring a polling consumer holds a lease on
/// (`POLL_LEASE`): the writer then rings no doorbell, and the consumer's messages wake nobody.
///
/// The bells of the rings read (ring.rs) are polled too, after every other entry (`add_bells`):
/// they only wake the poll; `end` rearms the ones that rang and marks their connection's entry.
#[derive(Default)]
pub(crate) struct RingWatch {
    /// Each ring read: the index of its connection's entry, the index of its bell's entry.
    input: Vec<(usize, Arc<Ring>, Option<usize>)>,
    output: Vec<(usize, Arc<Ring>)>,
}

impl RingWatch {
    /// For a thread that waits for this ring's data (a driver): counts itself as a sleeper.
    pub fn watch_input(&mut self, index: usize, ring: &Arc<Ring>) {
        self.input.push((index, ring.clone(), None));
    }

    /// Appends the bells of the rings watched for input to `fds` (after the entries the
    /// caller matches with its own list, which these do not disturb).
    pub fn add_bells(&mut self, fds: &mut Vec<PollFd>) {
        for (_, ring, bell) in &mut self.input {
            if let Some(fd) = ring.bell_fd() {
                *bell = Some(fds.len());
                fds.push(PollFd::new(fd, POLLIN));
            }
        }
    }

    pub fn watch_output(&mut self, index: usize, ring: &Arc<Ring>) {
        self.output.push((index, ring.clone()));
    }

    /// Counts us as a possible sleeper on every ring we read: true if one holds data already
    /// or one we write has room (then the caller polls without waiting).
    pub fn begin(&self) -> bool {
        let readable = self
            .input
            .iter()
            .fold(false, |ready, (_, r, _)| r.begin_sleep() | ready);
        readable || self.output.iter().any(|(_, r)| r.has_room())
    }

    /// Ends what `begin` started, and marks the entries whose ring holds data readable and
    /// those whose peer ring has room writable.
    pub fn end(&self, fds: &mut [PollFd]) {
        for (i, r, bell) in &self.input {
            r.end_sleep();
            if bell.is_some_and(|b| fds[b].revents() != 0) {
                r.drain_bell();
            }
            if r.has_data() {
                fds[*i].mark(POLLIN);
            }
        }
        for (i, r) in &self.output {
            if r.has_room() {
                fds[*i].mark(POLLOUT);
            }
        }
    }
}

/// poll(2) that first looks without sleeping until `until` (spinning), and only then sleeps
/// for up to `timeout`. Returns how many descriptors are ready. With `yield_cpu`, each look
/// that finds nothing gives the CPU to any other runnable thread: the progress thread spins
/// that way, since on a machine with as many busy threads as CPUs the application thread it
/// would keep off the CPU may be the very one that produces the next frame (measured: RDMA
/// write ping-pong over veth on 2 CPUs, 66 us one-way with the progress threads spinning
/// hard, 18 us yielding). An application thread waiting for its own completion spins hard.
pub(crate) fn spin_poll(
    fds: &mut [PollFd],
    until: Instant,
    timeout: Duration,
    yield_cpu: bool,
) -> io::Result<usize> {
    loop {
        let n = sys::poll(fds, 0)?;
        if n > 0 {
            return Ok(n);
        }
        if Instant::now() >= until {
            break;
        }
        if yield_cpu {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    sys::poll_for(fds, timeout)
}

// ---- dead-peer detection ---------------------------------------------------------------------

/// Environment variable that sets the dead-peer detection time in milliseconds (see
/// `watch_peer`); 0 turns the detection off (the kernel's defaults: about 15 minutes with data
/// in flight, never on an idle connection).
pub(crate) const PEER_TIMEOUT_ENV: &str = "DAPLRS_PEER_TIMEOUT_MS";
/// The detection time when the variable is unset or unreadable.
pub(crate) const PEER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// The detection time in effect: `DAPLRS_PEER_TIMEOUT_MS`, read once per process. None: off.
pub(crate) fn peer_timeout() -> Option<Duration> {
    static TIMEOUT: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *TIMEOUT.get_or_init(|| parse_peer_timeout(std::env::var(PEER_TIMEOUT_ENV).ok().as_deref()))
}

/// `DAPLRS_PEER_TIMEOUT_MS`'s value: a whole number of milliseconds, 0 for off, at most one
/// day; anything else gives the default (with a warning).
pub(crate) fn parse_peer_timeout(value: Option<&str>) -> Option<Duration> {
    let Some(v) = value else {
        return Some(PEER_TIMEOUT_DEFAULT);
    };
    match v.trim().parse::<u64>() {
        Ok(0) => None,
        Ok(ms) if ms <= 86_400_000 => Some(Duration::from_millis(ms)),
        _ => {
            log::warn!(
                "{PEER_TIMEOUT_ENV}={v:?} is not a number of milliseconds (0..=86400000); using {} ms",
                PEER_TIMEOUT_DEFAULT.as_millis()
            );
            Some(PEER_TIMEOUT_DEFAULT)
        }
    }
}

/// The keepalive settings for detection time `t`: (idle seconds, interval seconds, probes).
/// The first probe goes out after `t`/2 of silence, the next ones every `t`/6 (at least a
/// second each, the kernel's unit); with TCP_USER_TIMEOUT set the kernel gives up once `t` has
/// passed since the peer was last heard and a probe is unanswered, so the probe count only
/// matters to kernels without it.
pub(crate) fn keepalive_for(t: Duration) -> (i32, i32, i32) {
    let ms = t.as_millis().min(i32::MAX as u128) as i32;
    let idle = (ms / 2 / 1000).max(1);
    let interval = (ms / 6 / 1000).max(1);
    let probes = ((ms / 1000 - idle) / interval).clamp(1, 127);
    (idle, interval, probes)
}

/// Dead-peer detection on a connection's socket, so that a peer which stops answering (host
/// gone, link down, cable cut: nothing closes the connection) breaks it within the detection
/// time instead of the kernel's 15 minutes of retransmissions, or never when the connection is
/// idle:
///
/// * TCP_USER_TIMEOUT: data we sent (a request, an answer, a zero-window probe) unacknowledged
///   for that long ends the connection with ETIMEDOUT;
/// * SO_KEEPALIVE with TCP_KEEPIDLE/KEEPINTVL/KEEPCNT: an idle connection is probed, and
///   ended when the peer's kernel stops answering.
///
/// Both watch the peer's kernel, not its process: a stopped (SIGSTOP) or busy peer still
/// acknowledges, so its connection stays up and DTOs wait for it; only once its receive window
/// stays shut for the detection time with our data queued does the kernel give up (Linux 5.11
/// and later). The engine sees the error as any other socket error: BROKEN, DTOs flushed.
/// Failures to set an option are logged, not fatal (the connection works, detection is slower).
pub(super) fn watch_peer(stream: &TcpStream) {
    let Some(t) = peer_timeout() else {
        return;
    };
    let fd = stream.as_raw_fd();
    let (idle, interval, probes) = keepalive_for(t);
    let user_timeout = t.as_millis().min(i32::MAX as u128) as i32;
    let options = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1, "SO_KEEPALIVE"),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle, "TCP_KEEPIDLE"),
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPINTVL,
            interval,
            "TCP_KEEPINTVL",
        ),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, probes, "TCP_KEEPCNT"),
        (
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            user_timeout,
            "TCP_USER_TIMEOUT",
        ),
    ];
    for (level, name, value, what) in options {
        if let Err(e) = sys::set_int_option(fd, level, name, value) {
            log::warn!("{what}={value} on a connection: {e}");
        }
    }
}

#[cfg(test)]
#[path = "liveness_tests.rs"]
mod liveness_tests;

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
