//! Unreliable datagrams of the TCP transport: a datagram QP is a UDP socket bound to the
//! device's address (its QP number on the wire is the socket's port), and its address
//! resolution rides on the connection handshake: HELLO and ACCEPT with `FLAG_UD` carry each
//! side's QP number, then the TCP connection closes (docs/wire-protocol.md, "Datagrams").
//!
//! What UDP gives is what an InfiniBand UD QP gives: a message arrives whole or not at all, in
//! no promised order, and nobody learns which. A datagram that finds no receive posted is
//! dropped and counted (`Shared::ud_dropped`); one larger than the receive posted first fails
//! that receive (LocalLength). A failed request stops the QP as a verbs QP's error state
//! does: Error, everything else flushed, `CmEvent::Broken`. Every receive starts with a
//! 40-byte GRH area, written here as an InfiniBand GRH whose GIDs are the IPv4-mapped source
//! and destination addresses.

use std::net::{Ipv4Addr, UdpSocket};

use super::*;
use daplrs_backend::{AddressHandle, UdPeer, GRH_LEN};

/// A datagram QP's socket and the datagrams waiting for room in it.
pub(crate) struct UdQp {
    pub sock: UdpSocket,
    pub port: u16,
    pub out: VecDeque<UdOut>,
}

/// A datagram posted and not yet handed to the kernel.
pub(crate) struct UdOut {
    pub wr_id: u64,
    pub ctx: WrContext,
    pub dest: SocketAddrV4,
    /// Datagram header and message.
    pub datagram: Vec<u8>,
}

/// An address resolution under way on the active side.
pub(crate) struct UdResolve {
    qp: u32,
    hello: Vec<u8>,
    deadline: Option<Instant>,
    /// The TCP connection of its handshake, once connected.
    conn: Option<u64>,
}

/// An address handle of the TCP transport: the remote IA's IPv4 address (the port is the
/// remote QP number a send names).
#[derive(Debug)]
pub(crate) struct TcpAh {
    pub addr: Ipv4Addr,
}

impl AddressHandle for TcpAh {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn address(&self) -> Ipv4Addr {
        self.addr
    }
}

fn peer(addr: Ipv4Addr, qpn: u32) -> UdPeer {
    UdPeer {
        ah: Arc::new(TcpAh { addr }),
        qpn,
    }
}

impl Engine {
    /// A new datagram QP on `sock` (bound to the device's address), ready at once.
    pub(crate) fn create_ud_qp(
        &mut self,
        sock: UdpSocket,
        local: SocketAddrV4,
        pd: u32,
        send_cq: Arc<Completions>,
        recv_cq: Arc<Completions>,
        cap: QpCap,
    ) -> u32 {
        let n = self.create_qp(pd, send_cq, recv_cq, None, cap);
        if let Some(e) = self.qps.get_mut(&n) {
            e.state = QpState::Connected;
            e.local = Some(local);
            e.ud = Some(UdQp {
                sock,
                port: local.port(),
                out: VecDeque::new(),
            });
            self.ud_qps.insert(n);
        }
        // The progress thread polls the new socket from its next round.
        self.wake_needed = true;
        n
    }

    /// The datagram sockets the progress thread polls: (QP, fd, whether output waits).
    pub(crate) fn ud_sockets(&self) -> Vec<(u32, std::os::fd::RawFd, bool)> {
        self.ud_qps
            .iter()
            .filter_map(|n| {
                let u = self.qps.get(n)?.ud.as_ref()?;
                Some((*n, u.sock.as_raw_fd(), !u.out.is_empty()))
            })
            .collect()
    }

    /// A request of `qp` failed: it completes with `status`, and the QP stops (Error,
    /// everything else flushed, Broken), as a verbs QP does.
    fn ud_failed_request(
        &mut self,
        qp: u32,
        wr_id: u64,
        ctx: WrContext,
        status: WcStatus,
        send: bool,
    ) {
        self.ud_complete(qp, (wr_id, ctx), status, 0, send);
        self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
    }

    /// `request`: the wr_id and context of the request or receive completing.
    fn ud_complete(
        &mut self,
        qp: u32,
        request: (u64, WrContext),
        status: WcStatus,
        len: u32,
        send: bool,
    ) {
        let (wr_id, ctx) = request;
        let Some(e) = self.qps.get(&qp) else { return };
        let cq = if send {
            e.send_cq.clone()
        } else {
            e.recv_cq.clone()
        };
        self.push_wc(
            &cq,
            WorkCompletion::new(
                wr_id,
                status,
                if send { WcOpcode::Send } else { WcOpcode::Recv },
                len,
                qp,
            )
            .with_ctx(ctx),
        );
    }

    /// Sends `wr`'s message as one datagram to `dest`; it completes once the kernel took it.
    pub(crate) fn post_send_ud(
        &mut self,
        sh: &Shared,
        qp: u32,
        wr: SendWr,
        dest: SocketAddrV4,
    ) -> Result<()> {
        let e = self.qps.get_mut(&qp).ok_or_else(bad_state)?;
        let Some(ud) = e.ud.as_ref() else {
            return Err(bad_state());
        };
        match e.state {
            QpState::Connected => {}
            QpState::Error => {
                self.ud_complete(qp, (wr.wr_id, wr.ctx), WcStatus::Flushed, 0, true);
                return Ok(());
            }
            _ => return Err(bad_state()),
        }
        if !matches!(wr.op, SendOp::Send) {
            return Err(Error::Invalid);
        }
        if ud.out.len() >= e.cap.max_send_wr.max(1) as usize {
            return Err(Error::NoResource(Resource::WorkQueue));
        }
        let message = match sh.keys.read().gather(&wr.sgl, e.pd) {
            Ok(m) => m,
            Err(status) => {
                self.ud_failed_request(qp, wr.wr_id, wr.ctx, status, true);
                return Ok(());
            }
        };
        if message.len() as u64 > u64::from(sh.attr.mtu) {
            self.ud_failed_request(qp, wr.wr_id, wr.ctx, WcStatus::LocalLength, true);
            return Ok(());
        }
        let flags = if wr.solicited {
            wire::FLAG_SOLICITED
        } else {
            0
        };
        let mut datagram = Vec::with_capacity(wire::UD_HEADER_LEN + message.len());
        datagram.extend_from_slice(&wire::ud_header(flags));
        datagram.extend_from_slice(&message);
        if let Some(ud) = self.qps.get_mut(&qp).and_then(|e| e.ud.as_mut()) {
            ud.out.push_back(UdOut {
                wr_id: wr.wr_id,
                ctx: wr.ctx,
                dest,
                datagram,
            });
        }
        self.flush_ud(qp);
        Ok(())
    }

    /// Hands queued datagrams to the kernel until done or its buffer is full (the progress
    /// thread continues when the socket takes more).
    pub(crate) fn flush_ud(&mut self, qp: u32) {
        loop {
            let Some(ud) = self.qps.get_mut(&qp).and_then(|e| e.ud.as_mut()) else {
                return;
            };
            let Some(o) = ud.out.front() else { return };
            let result = ud.sock.send_to(&o.datagram, o.dest);
            let status = match result {
                Ok(_) => WcStatus::Success,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wake_needed = true;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // No route, refused by a local firewall: the datagram cannot leave.
                    log::info!("qp {qp}: datagram to {} not sent: {e}", o.dest);
                    WcStatus::Transport
                }
            };
            let Some(o) = ud.out.pop_front() else { return };
            if status != WcStatus::Success {
                return self.ud_failed_request(qp, o.wr_id, o.ctx, status, true);
            }
            let len = (o.datagram.len() - wire::UD_HEADER_LEN) as u32;
            self.ud_complete(qp, (o.wr_id, o.ctx), status, len, true);
        }
    }

    /// Receives what waits on `qp`'s socket: each datagram fills the receive posted first.
    pub(crate) fn read_ud(&mut self, sh: &Shared, qp: u32, buf: &mut [u8]) {
        for _ in 0..64 {
            let Some(e) = self.qps.get_mut(&qp) else {
                return;
            };
            let Some(ud) = e.ud.as_ref() else { return };
            let (n, src) = match ud.sock.recv_from(buf) {
                Ok((n, SocketAddr::V4(src))) => (n, src),
                Ok(_) => continue,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    // A pending socket error (reading it clears it).
                    log::debug!("qp {qp}: datagram socket: {err}");
                    continue;
                }
            };
            let Some((flags, message)) = wire::ud_parse(&buf[..n]) else {
                log::debug!("qp {qp}: not a datagram of ours from {src}, dropped");
                continue;
            };
            if e.state != QpState::Connected {
                continue; // a QP in Error receives nothing
            }
            let Some(wr) = e.rq.pop_front() else {
                sh.ud_dropped.fetch_add(1, Ordering::Relaxed);
                log::debug!("qp {qp}: datagram from {src} dropped: no receive posted");
                continue;
            };
            let mut data = Vec::with_capacity(GRH_LEN as usize + message.len());
            data.extend_from_slice(&daplrs_backend::software_grh(
                *src.ip(),
                sh.addr,
                message.len(),
            ));
            data.extend_from_slice(message);
            let status = match sh.keys.read().scatter(&wr.sgl, e.pd, &data) {
                Ok(()) => WcStatus::Success,
                Err(s) => s,
            };
            if status != WcStatus::Success {
                self.ud_failed_request(qp, wr.wr_id, wr.ctx, status, false);
                continue;
            }
            let rcq = e.recv_cq.clone();
            self.push_wc(
                &rcq,
                WorkCompletion {
                    solicited: flags & wire::FLAG_SOLICITED != 0,
                    ..wr.completion(status, WcOpcode::Recv, data.len() as u32, qp)
                },
            );
        }
    }

    // ---- address resolution ------------------------------------------------------------------

    /// Starts resolving the datagram QP behind the listener the caller connects to; the
    /// TCP connect itself is done by a helper thread (`ud_connect_results`).
    pub(crate) fn begin_ud_resolve(
        &mut self,
        qp: u32,
        hello: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        let e = self.qps.get(&qp).ok_or_else(bad_state)?;
        if e.ud.is_none() || e.state != QpState::Connected {
            return Err(bad_state());
        }
        let id = self.token();
        self.ud_pending.insert(
            id,
            UdResolve {
                qp,
                hello,
                deadline: timeout.map(|t| Instant::now() + t),
                conn: None,
            },
        );
        Ok(id)
    }

    /// Sends the HELLO of each resolution whose TCP connect finished.
    pub(crate) fn process_ud_connect_results(&mut self) {
        for (id, result) in std::mem::take(&mut self.ud_connect_results) {
            let Some(r) = self.ud_pending.get(&id) else {
                continue; // given up meanwhile; the socket just closes
            };
            let port = self
                .qps
                .get(&r.qp)
                .and_then(|e| e.ud.as_ref())
                .map(|u| u.port);
            let stream = match (result, port) {
                (Ok(s), Some(port)) if s.set_nonblocking(true).is_ok() => (s, port),
                (Err(err), _) => {
                    log::info!("datagram address resolution {id}: {err}");
                    self.ud_failed(id, false, Vec::new());
                    continue;
                }
                _ => {
                    self.ud_failed(id, false, Vec::new());
                    continue;
                }
            };
            let (stream, port) = stream;
            tune(&stream);
            let token = self.token();
            let Some(r) = self.ud_pending.get_mut(&id) else {
                continue;
            };
            r.conn = Some(token);
            let charge = Charge::new(self.peer_memory.clone());
            let mut conn = Conn::new(stream, Phase::UdAwaitReply { id }, r.deadline, charge);
            let mut h = wire::handshake(Kind::Hello);
            h.flags = wire::FLAG_UD;
            h.length = u32::from(port);
            conn.out.push_frame(h, std::mem::take(&mut r.hello));
            self.conns.insert(token, conn);
            self.try_write(token);
        }
    }

    /// The answer to a resolution's HELLO.
    pub(super) fn ud_reply(&mut self, token: u64, id: u64, h: &Header, p: Vec<u8>) {
        match h.kind {
            Kind::Accept if h.flags & wire::FLAG_UD != 0 => {
                let remote = self
                    .conns
                    .get(&token)
                    .and_then(|c| v4(c.stream.peer_addr()));
                match remote {
                    Some(remote) => self.ud_resolved(id, *remote.ip(), h.length, p),
                    None => self.ud_failed(id, false, Vec::new()),
                }
            }
            Kind::Reject => self.ud_failed(id, h.status == Status::Ok, p),
            // An ACCEPT without FLAG_UD: a peer that made it a connection (it does not know
            // datagrams); closing it breaks that connection there.
            _ => self.ud_failed(id, false, Vec::new()),
        }
    }

    fn ud_resolved(&mut self, id: u64, addr: Ipv4Addr, qpn: u32, private_data: Vec<u8>) {
        let Some(r) = self.ud_pending.remove(&id) else {
            return;
        };
        self.end_ud_conn(r.conn);
        self.emit(CmEvent::UdResolved {
            qp_num: r.qp,
            id,
            peer: peer(addr, qpn),
            private_data,
        });
    }

    pub(super) fn ud_failed(&mut self, id: u64, by_peer: bool, private_data: Vec<u8>) {
        let Some(r) = self.ud_pending.remove(&id) else {
            return;
        };
        self.end_ud_conn(r.conn);
        self.emit(CmEvent::UdFailed {
            qp_num: r.qp,
            id,
            by_peer,
            private_data,
        });
    }

    /// The handshake connection of a resolution has done its work: closed without a reset.
    fn end_ud_conn(&mut self, conn: Option<u64>) {
        let Some(token) = conn else { return };
        if let Some(c) = self.conns.get_mut(&token) {
            c.begin_close();
            self.try_write(token);
        }
    }

    /// Resolutions of a QP being destroyed end without an event (nobody is left to see it).
    pub(super) fn forget_ud_resolutions(&mut self, qp: u32) {
        let ids: Vec<u64> = self
            .ud_pending
            .iter()
            .filter(|(_, r)| r.qp == qp)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(r) = self.ud_pending.remove(&id) {
                if let Some(t) = r.conn {
                    self.conns.remove(&t);
                }
            }
        }
    }

    /// Resolutions past their deadline fail (TimedOut, as a connection's would).
    pub(super) fn check_ud_deadlines(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .ud_pending
            .iter()
            .filter(|(_, r)| r.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(t) = self.ud_pending.get(&id).and_then(|r| r.conn) {
                self.conns.remove(&t);
            }
            if let Some(r) = self.ud_pending.get_mut(&id) {
                r.conn = None;
            }
            self.ud_failed(id, false, Vec::new());
        }
    }

    /// The passive side: answers a datagram QP's HELLO with `qp`'s number and closes; returns
    /// where the requester's QP is.
    pub(crate) fn ud_accept(&mut self, req: u64, qp: u32, private_data: &[u8]) -> Result<UdPeer> {
        let port = match self.qps.get(&qp) {
            Some(e) if e.state == QpState::Connected => {
                e.ud.as_ref().map(|u| u.port).ok_or_else(bad_state)?
            }
            _ => return Err(bad_state()),
        };
        let Some(c) = self.conns.get_mut(&req) else {
            // The requester gave up (its connection closed) before the answer.
            return Err(Error::BadState);
        };
        let Phase::PassiveUdRequested { qpn, .. } = c.phase else {
            return Err(bad_state());
        };
        let remote = v4(c.stream.peer_addr()).ok_or_else(bad_state)?;
        let mut h = wire::handshake(Kind::Accept);
        h.flags = wire::FLAG_UD;
        h.length = u32::from(port);
        c.out.push_frame(h, private_data.to_vec());
        c.begin_close();
        self.try_write(req);
        self.wake_needed = true;
        Ok(peer(*remote.ip(), qpn))
    }
}
