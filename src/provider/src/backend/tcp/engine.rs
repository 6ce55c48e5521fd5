//! The progress engine of the TCP transport: queue pairs, connections, the wire protocol's
//! state machines, and the poll loop of the progress thread.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::{
    CmEvent, QpCap, QpState, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};
use super::sys::{self, PollFd, POLLERR, POLLHUP, POLLIN, POLLNVAL, POLLOUT};
use super::wire::{self, Decoder, Header, Kind, OutQueue, Status};
use super::{Shared, TcpCq, TcpSrq};
use crate::core::error::{DatError, DatResult, SubType};

/// A peer that has not sent its HELLO by then is dropped.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// Target-side requests queued behind a send that waits for a receive; past this many bytes we
/// stop reading the socket (back-pressure instead of unbounded buffering).
const HOLD_LIMIT: usize = 8 << 20;
/// Poll timeout: the granularity of connection deadlines.
const TICK_MS: i32 = 50;
/// Socket send buffer asked for (see `tune`).
const SEND_BUFFER: i32 = 4 << 20;
/// How long a closing connection may take to send what is left and then to see the peer's end
/// of stream. Closing a socket that still has unread input makes the kernel reset the
/// connection, and a reset discards what the peer has not read yet (our last answers): so a
/// closing connection keeps reading and discarding until the peer closes too, for this long.
const CLOSE_LINGER: Duration = Duration::from_secs(5);

pub(crate) enum Deferred {
    Notify(Arc<TcpCq>),
    Cm(CmEvent),
    /// The driver of this CQ must look at its connections again (output is waiting).
    Interrupt(u64),
}

pub(crate) struct ListenerEntry {
    pub sock: TcpListener,
}

struct Outstanding {
    wr_id: u64,
    opcode: WcOpcode,
    len: u32,
    seq: u64,
    read_sgl: Vec<Sge>,
    /// A local operation (memory-window bind) already applied, completing in order.
    local: Option<WcStatus>,
}

struct QpEntry {
    pd: u32,
    /// Requests posted but not started: a request with the fence flag waits here until every
    /// earlier RDMA read of the QP has completed (its data must not be gathered before), and
    /// every request posted after it waits behind it, so the wire order is the post order.
    fenced: VecDeque<SendWr>,
    send_cq: Arc<TcpCq>,
    recv_cq: Arc<TcpCq>,
    srq: Option<Arc<TcpSrq>>,
    cap: QpCap,
    state: QpState,
    rq: VecDeque<RecvWr>,
    outstanding: VecDeque<Outstanding>,
    conn: Option<u64>,
    attempt: u64,
    hello: Vec<u8>,
    deadline: Option<Instant>,
    graceful_pending: bool,
    local: Option<SocketAddrV4>,
    remote: Option<SocketAddrV4>,
    next_seq: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    ActiveAwaitReply {
        qp: u32,
    },
    PassiveAwaitHello {
        listener: u64,
    },
    PassiveRequested {
        listener: u64,
    },
    Established {
        qp: u32,
    },
    /// Sending what is left, then closing.
    Closing,
}

struct Conn {
    stream: TcpStream,
    phase: Phase,
    dec: Decoder,
    out: OutQueue,
    held: VecDeque<(Header, Vec<u8>)>,
    held_bytes: usize,
    deadline: Option<Instant>,
    close_when_flushed: bool,
    /// Everything is written and our side is shut: reading and discarding until the peer's end
    /// of stream (or CLOSE_LINGER), so that closing sends no reset.
    draining: bool,
    /// A write failed (the peer closed or reset): nothing more is written; what the peer sent
    /// before is read and processed, then the connection is lost (`settle_failed_writes`).
    write_failed: bool,
    /// An application thread waiting for a completion polls this socket itself (`TcpCq::drive`);
    /// the progress thread leaves it alone meanwhile. The id of the driver's CQ.
    driven: Option<u64>,
    /// A large READ_RESP payload being received straight into the read's local buffers.
    sink: Option<ReadSink>,
    /// An RDMA read is held until the output queue has drained (see `target_request`).
    wait_drain: bool,
}

/// The rest of a READ_RESP payload goes from the socket into the local SGL of the read it
/// answers (one copy, the kernel's, instead of two).
struct ReadSink {
    qp: u32,
    header: Header,
    sgl: Vec<Sge>,
    pd: u32,
    got: usize,
    /// A local error met on the way (the rest of the payload is then read and dropped).
    failed: Option<WcStatus>,
}

enum SinkStep {
    More,
    Blocked,
    Gone,
}

/// A connection an application thread drives for a while.
pub(crate) struct Claim {
    pub token: u64,
    pub fd: std::os::fd::RawFd,
    /// Watch for input (not while back-pressured) and for room to write.
    pub input: bool,
    pub output: bool,
}

impl Conn {
    fn new(stream: TcpStream, phase: Phase, deadline: Option<Instant>) -> Conn {
        Conn {
            stream,
            phase,
            dec: Decoder::new(),
            out: OutQueue::default(),
            held: VecDeque::new(),
            held_bytes: 0,
            deadline,
            close_when_flushed: false,
            draining: false,
            write_failed: false,
            driven: None,
            sink: None,
            wait_drain: false,
        }
    }

    fn is_closing(&self) -> bool {
        self.phase == Phase::Closing
    }

    /// Sends what the kernel takes now (never raising SIGPIPE).
    fn flush_out(&mut self) -> io::Result<()> {
        send_out(&mut self.out, &self.stream)
    }

    /// Ends the connection after what is queued has been sent: the peer reads everything up
    /// to our last frame, then our end of stream. Frames from the peer are no longer processed.
    fn begin_close(&mut self) {
        self.phase = Phase::Closing;
        self.close_when_flushed = true;
        self.held.clear();
        self.held_bytes = 0;
        self.deadline = Some(Instant::now() + CLOSE_LINGER);
    }
}

/// Writes `out` to `stream` until done or the socket refuses, with sendmsg(MSG_NOSIGNAL): a
/// library must not raise SIGPIPE in its host when a peer has gone away.
pub(super) fn send_out(out: &mut OutQueue, stream: &TcpStream) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    out.write_with(|slices| sys::send_nosignal(fd, slices))
}

enum Outcome {
    Done,
    Hold,
    Broken,
}

#[derive(Default)]
pub(crate) struct Engine {
    qps: HashMap<u32, QpEntry>,
    conns: HashMap<u64, Conn>,
    pub(crate) listeners: HashMap<u64, ListenerEntry>,
    pub(crate) connect_results: Vec<(u32, u64, io::Result<TcpStream>)>,
    next_token: u64,
    next_qp: u32,
    pub(crate) deferred: Vec<Deferred>,
    pub(crate) wake_needed: bool,
    /// Connections whose last write failed, to be read out and then reported lost.
    failed_writes: Vec<u64>,
    /// The progress thread polls without the connections drivers had claimed.
    poll_excludes: bool,
    /// Connections whose output drained while requests were held behind it.
    drained: Vec<u64>,
}

fn v4(a: io::Result<SocketAddr>) -> Option<SocketAddrV4> {
    match a {
        Ok(SocketAddr::V4(v)) => Some(v),
        _ => None,
    }
}

/// Socket options of every connection: no Nagle delay (requests and answers are small and
/// latency-bound), and a send buffer that takes a large answer in one write, so it goes out
/// straight from registered memory rather than through a copy queued for later.
fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = sys::set_send_buffer(stream.as_raw_fd(), SEND_BUFFER);
}

fn bad_state() -> DatError {
    DatError::invalid_state(SubType::None)
}

fn opcode_of(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send => WcOpcode::Send,
        SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::BindMw { .. } => WcOpcode::BindMw,
    }
}

impl Engine {
    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }

    fn emit(&mut self, ev: CmEvent) {
        self.deferred.push(Deferred::Cm(ev));
    }

    fn push_wc(&mut self, cq: &Arc<TcpCq>, wc: WorkCompletion) {
        cq.push(wc);
        self.deferred.push(Deferred::Notify(cq.clone()));
    }

    // ---- queue pairs ---------------------------------------------------------------------------

    pub(crate) fn create_qp(
        &mut self,
        pd: u32,
        send_cq: Arc<TcpCq>,
        recv_cq: Arc<TcpCq>,
        srq: Option<Arc<TcpSrq>>,
        cap: QpCap,
    ) -> u32 {
        self.next_qp += 1;
        let n = self.next_qp;
        self.qps.insert(
            n,
            QpEntry {
                pd,
                fenced: VecDeque::new(),
                send_cq,
                recv_cq,
                srq,
                cap,
                state: QpState::Init,
                rq: VecDeque::new(),
                outstanding: VecDeque::new(),
                conn: None,
                attempt: 0,
                hello: Vec::new(),
                deadline: None,
                graceful_pending: false,
                local: None,
                remote: None,
                next_seq: 1,
            },
        );
        n
    }

    /// The socket of `qp`'s connection (tests watch it for the peer's reset).
    #[cfg(test)]
    pub(crate) fn conn_fd(&self, qp: u32) -> Option<std::os::fd::RawFd> {
        let token = self.qps.get(&qp)?.conn?;
        self.conns.get(&token).map(|c| c.stream.as_raw_fd())
    }

    /// Claims for a driver the established connections of the QPs that complete into CQ `cq`
    /// and nobody drives yet.
    pub(crate) fn claim_for_cq(&mut self, cq: u64) -> Vec<Claim> {
        let mut out = Vec::new();
        for e in self.qps.values() {
            if e.send_cq.id != cq && e.recv_cq.id != cq {
                continue;
            }
            let Some(token) = e.conn else { continue };
            let Some(c) = self.conns.get_mut(&token) else {
                continue;
            };
            if c.driven.is_some() || c.write_failed || !matches!(c.phase, Phase::Established { .. })
            {
                continue;
            }
            let (input, output) = (c.held_bytes <= HOLD_LIMIT, !c.out.is_empty());
            if !input && !output {
                continue; // back-pressured: nothing to watch (see `progress_loop`)
            }
            c.driven = Some(cq);
            out.push(Claim {
                token,
                fd: c.stream.as_raw_fd(),
                input,
                output,
            });
        }
        out
    }

    /// Returns claimed connections to the progress thread, woken if it polls without them
    /// (or if one has output waiting), so that nothing arriving now waits for its next tick.
    pub(crate) fn release_claims(&mut self, claims: &[Claim]) {
        for cl in claims {
            if let Some(c) = self.conns.get_mut(&cl.token) {
                c.driven = None;
                if !c.out.is_empty() || self.poll_excludes {
                    self.wake_needed = true;
                    self.poll_excludes = false;
                }
            }
        }
    }

    pub(crate) fn qp_state(&self, qp: u32) -> QpState {
        self.qps.get(&qp).map(|e| e.state).unwrap_or(QpState::Error)
    }

    pub(crate) fn posted_recvs(&self, qp: u32) -> u32 {
        self.qps.get(&qp).map(|e| e.rq.len() as u32).unwrap_or(0)
    }

    pub(crate) fn qp_addrs(&self, qp: u32) -> (Option<SocketAddrV4>, Option<SocketAddrV4>) {
        self.qps
            .get(&qp)
            .map(|e| (e.local, e.remote))
            .unwrap_or((None, None))
    }

    /// Completes every outstanding request and posted receive of `qp` as Flushed.
    fn flush_qp(&mut self, qp: u32) {
        let Some(e) = self.qps.get_mut(&qp) else {
            return;
        };
        // In post order: the started requests, then those waiting behind a fence.
        let mut sends: Vec<(u64, WcOpcode)> = e
            .outstanding
            .drain(..)
            .map(|o| (o.wr_id, o.opcode))
            .collect();
        sends.extend(e.fenced.drain(..).map(|w| (w.wr_id, opcode_of(&w.op))));
        let recvs: Vec<RecvWr> = e.rq.drain(..).collect();
        let (scq, rcq) = (e.send_cq.clone(), e.recv_cq.clone());
        for (wr_id, opcode) in sends {
            self.push_wc(
                &scq,
                WorkCompletion {
                    wr_id,
                    status: WcStatus::Flushed,
                    opcode,
                    byte_len: 0,
                    qp_num: qp,
                    new_rkey: 0,
                },
            );
        }
        for r in recvs {
            self.push_wc(
                &rcq,
                WorkCompletion {
                    wr_id: r.wr_id,
                    status: WcStatus::Flushed,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    qp_num: qp,
                    new_rkey: 0,
                },
            );
        }
    }

    /// Moves `qp` to Error: drops its connection at once (no goodbye), flushes, reports `ev`.
    fn fail_qp(&mut self, qp: u32, ev: Option<CmEvent>) {
        let Some(e) = self.qps.get_mut(&qp) else {
            return;
        };
        if e.state == QpState::Error {
            return;
        }
        e.state = QpState::Error;
        e.graceful_pending = false;
        if let Some(t) = e.conn.take() {
            self.conns.remove(&t);
        }
        self.flush_qp(qp);
        if let Some(ev) = ev {
            self.emit(ev);
        }
    }

    /// Target-side break after a failed request: the answer already queued still goes out,
    /// then the connection closes.
    fn break_after_answer(&mut self, token: u64, qp: u32) {
        if let Some(c) = self.conns.get_mut(&token) {
            c.begin_close();
        }
        if let Some(e) = self.qps.get_mut(&qp) {
            e.conn = None;
            e.state = QpState::Error;
            e.graceful_pending = false;
        }
        self.flush_qp(qp);
        self.emit(CmEvent::Broken { qp_num: qp });
        self.try_write(token);
    }

    pub(crate) fn reset_qp(&mut self, qp: u32) -> DatResult<()> {
        let e = self.qps.get_mut(&qp).ok_or_else(bad_state)?;
        match e.state {
            QpState::Error | QpState::Init => {}
            _ => return Err(bad_state()),
        }
        e.state = QpState::Init;
        e.conn = None;
        e.graceful_pending = false;
        e.local = None;
        e.remote = None;
        e.deadline = None;
        // Receives posted in Init survive a reset of an Init QP; an Error QP has none left.
        Ok(())
    }

    pub(crate) fn destroy_qp(&mut self, _sh: &Shared, qp: u32) {
        let Some(e) = self.qps.get_mut(&qp) else {
            return;
        };
        e.state = QpState::Error;
        if let Some(t) = e.conn.take() {
            self.goodbye(t);
        }
        self.flush_qp(qp);
        self.qps.remove(&qp);
    }

    /// Queues DISCONNECT on an established connection and closes it once sent.
    fn goodbye(&mut self, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if matches!(c.phase, Phase::Established { .. }) {
            c.out.push_frame(Header::new(Kind::Disconnect), Vec::new());
            c.begin_close();
            self.try_write(token);
        } else {
            self.conns.remove(&token);
        }
    }

    // ---- connection management -----------------------------------------------------------------

    pub(crate) fn begin_connect(
        &mut self,
        qp: u32,
        remote: SocketAddrV4,
        hello: Vec<u8>,
        timeout: Option<Duration>,
    ) -> DatResult<u64> {
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

    fn process_connect_results(&mut self) {
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
                    let mut conn = Conn::new(stream, Phase::ActiveAwaitReply { qp }, deadline);
                    conn.out.push_frame(wire::handshake(Kind::Hello), hello);
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
                        _ => CmEvent::Rejected {
                            qp_num: qp,
                            private_data: Vec::new(),
                            by_peer: false,
                        },
                    };
                    self.fail_qp(qp, Some(ev));
                }
            }
        }
    }

    pub(crate) fn accept(
        &mut self,
        _sh: &Shared,
        req: u64,
        qp: u32,
        private_data: &[u8],
    ) -> DatResult<()> {
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
        let Some(c) = self.conns.get_mut(&req) else {
            return Err(bad_state());
        };
        let (local, remote) = (v4(c.stream.local_addr()), v4(c.stream.peer_addr()));
        c.phase = Phase::Established { qp };
        c.out
            .push_frame(wire::handshake(Kind::Accept), private_data.to_vec());
        if let Some(e) = self.qps.get_mut(&qp) {
            e.state = QpState::Connected;
            e.conn = Some(req);
            e.local = local;
            e.remote = remote;
        }
        self.emit(CmEvent::Established {
            qp_num: qp,
            private_data: Vec::new(),
        });
        self.try_write(req);
        self.wake_needed = true;
        Ok(())
    }

    pub(crate) fn reject(&mut self, _sh: &Shared, req: u64, private_data: &[u8]) -> DatResult<()> {
        let Some(c) = self.conns.get_mut(&req) else {
            return Ok(());
        };
        if !matches!(
            c.phase,
            Phase::PassiveRequested { .. } | Phase::PassiveAwaitHello { .. }
        ) {
            return Err(bad_state());
        }
        c.out
            .push_frame(Header::new(Kind::Reject), private_data.to_vec());
        c.begin_close();
        self.try_write(req);
        Ok(())
    }

    pub(crate) fn disconnect(&mut self, _sh: &Shared, qp: u32, abrupt: bool) -> DatResult<()> {
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

    fn finish_disconnect(&mut self, qp: u32) {
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
        self.conns.clear();
        self.listeners.clear();
    }

    // ---- posting -------------------------------------------------------------------------------

    fn complete(&mut self, qp: u32, o: &Outstanding, status: WcStatus) {
        let Some(e) = self.qps.get(&qp) else { return };
        let cq = e.send_cq.clone();
        self.push_wc(
            &cq,
            WorkCompletion {
                wr_id: o.wr_id,
                status,
                opcode: o.opcode,
                byte_len: if status == WcStatus::Success {
                    o.len
                } else {
                    0
                },
                qp_num: qp,
                new_rkey: 0,
            },
        );
    }

    /// Completes local operations that reached the head of the queue.
    fn complete_local_heads(&mut self, qp: u32) {
        loop {
            let head_local = self
                .qps
                .get(&qp)
                .and_then(|e| e.outstanding.front())
                .and_then(|o| o.local);
            let Some(status) = head_local else { break };
            let Some(o) = self
                .qps
                .get_mut(&qp)
                .and_then(|e| e.outstanding.pop_front())
            else {
                break;
            };
            self.complete(qp, &o, status);
            if status != WcStatus::Success {
                self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
                return;
            }
        }
        let done = self
            .qps
            .get(&qp)
            .map(|e| e.graceful_pending && e.outstanding.is_empty() && e.fenced.is_empty())
            .unwrap_or(false);
        if done {
            self.finish_disconnect(qp);
        }
    }

    pub(crate) fn post_send(&mut self, sh: &Shared, qp: u32, wr: SendWr) -> DatResult<()> {
        let e = self.qps.get_mut(&qp).ok_or_else(bad_state)?;
        let opcode = opcode_of(&wr.op);
        match e.state {
            QpState::Connected => {}
            QpState::Error => {
                let cq = e.send_cq.clone();
                self.push_wc(
                    &cq,
                    WorkCompletion {
                        wr_id: wr.wr_id,
                        status: WcStatus::Flushed,
                        opcode,
                        byte_len: 0,
                        qp_num: qp,
                        new_rkey: 0,
                    },
                );
                return Ok(());
            }
            _ => return Err(bad_state()),
        }
        if e.outstanding.len() + e.fenced.len() >= e.cap.max_send_wr.max(1) as usize {
            return Err(DatError::resources(SubType::None));
        }
        if e.conn.is_none() {
            return Err(bad_state());
        }
        if let SendOp::BindMw { new_rkey, .. } = &wr.op {
            // The window carries its new rkey from the post on (the next bind derives from
            // it), even if the bind itself waits behind a fence.
            if let Some(w) = sh
                .mws
                .lock()
                .get(&(new_rkey >> 8))
                .and_then(|w| w.upgrade())
            {
                w.note_posted(*new_rkey);
            }
        }
        let read_pending = e.outstanding.iter().any(|o| o.opcode == WcOpcode::RdmaRead);
        if !e.fenced.is_empty() || (wr.fence && read_pending) {
            e.fenced.push_back(wr);
            return Ok(());
        }
        self.start_send(sh, qp, wr);
        Ok(())
    }

    /// Starts requests that waited behind a fence, in order, as far as the fences allow.
    fn start_fenced(&mut self, sh: &Shared, qp: u32) {
        loop {
            let Some(e) = self.qps.get_mut(&qp) else {
                return;
            };
            if e.state != QpState::Connected {
                return;
            }
            let blocked = match e.fenced.front() {
                None => return,
                Some(w) => w.fence && e.outstanding.iter().any(|o| o.opcode == WcOpcode::RdmaRead),
            };
            if blocked {
                return;
            }
            let Some(wr) = e.fenced.pop_front() else {
                return;
            };
            self.start_send(sh, qp, wr);
        }
    }

    /// Executes a request on a connected QP: gathers its data now and queues its frame, or
    /// applies a bind; it joins the outstanding requests, which complete in order.
    fn start_send(&mut self, sh: &Shared, qp: u32, wr: SendWr) {
        let Some(e) = self.qps.get_mut(&qp) else {
            return;
        };
        let opcode = opcode_of(&wr.op);
        let Some(token) = e.conn else {
            return;
        };
        let pd = e.pd;
        let seq = e.next_seq;
        e.next_seq += 1;
        let mut o = Outstanding {
            wr_id: wr.wr_id,
            opcode,
            len: 0,
            seq,
            read_sgl: Vec::new(),
            local: None,
        };
        let mut frame: Option<(Header, Vec<u8>)> = None;
        let local_result: Result<(), WcStatus> = {
            let mut keys = sh.keys.lock();
            match wr.op {
                SendOp::Send => keys.gather(&wr.sgl, pd).map(|data| {
                    let mut h = Header::new(Kind::Send);
                    h.seq = seq;
                    if wr.solicited {
                        h.flags = wire::FLAG_SOLICITED;
                    }
                    o.len = data.len() as u32;
                    frame = Some((h, data));
                }),
                SendOp::RdmaWrite { remote_addr, rkey } => keys.gather(&wr.sgl, pd).map(|data| {
                    let mut h = Header::new(Kind::Write);
                    h.seq = seq;
                    h.addr = remote_addr;
                    h.key = rkey;
                    o.len = data.len() as u32;
                    frame = Some((h, data));
                }),
                SendOp::RdmaRead { remote_addr, rkey } => {
                    keys.check_local_sgl(&wr.sgl, pd, true).and_then(|total| {
                        if total > u64::from(sh.limits.max_message) {
                            return Err(WcStatus::LocalLength);
                        }
                        let mut h = Header::new(Kind::ReadReq);
                        h.seq = seq;
                        h.addr = remote_addr;
                        h.key = rkey;
                        h.length = total as u32;
                        o.len = total as u32;
                        o.read_sgl = wr.sgl.clone();
                        frame = Some((h, Vec::new()));
                        Ok(())
                    })
                }
                SendOp::BindMw {
                    mw: _,
                    mr,
                    addr,
                    length,
                    access,
                    new_rkey,
                } => {
                    let window = sh
                        .mws
                        .lock()
                        .get(&(new_rkey >> 8))
                        .and_then(|w| w.upgrade());
                    let ok = match window {
                        Some(w) => w.apply_bind(
                            &mut keys,
                            mr.as_ref().map(|m| m.lkey()),
                            addr,
                            length,
                            access,
                            new_rkey,
                        ),
                        None => false,
                    };
                    o.local = Some(if ok {
                        WcStatus::Success
                    } else {
                        WcStatus::MwBind
                    });
                    Ok(())
                }
            }
        };
        if let Err(status) = local_result {
            // A local error completes the request and breaks the connection, as on a NIC.
            self.complete(qp, &o, status);
            self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
            return;
        }
        if let Some(e) = self.qps.get_mut(&qp) {
            e.outstanding.push_back(o);
        }
        match frame {
            Some((h, payload)) => {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.out.push_frame(h, payload);
                }
                self.try_write(token);
            }
            None => self.complete_local_heads(qp),
        }
    }

    pub(crate) fn post_recv(&mut self, sh: &Shared, qp: u32, wr: RecvWr) -> DatResult<()> {
        let e = self.qps.get_mut(&qp).ok_or_else(bad_state)?;
        if e.srq.is_some() {
            return Err(bad_state());
        }
        if e.state == QpState::Error {
            let cq = e.recv_cq.clone();
            self.push_wc(
                &cq,
                WorkCompletion {
                    wr_id: wr.wr_id,
                    status: WcStatus::Flushed,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    qp_num: qp,
                    new_rkey: 0,
                },
            );
            return Ok(());
        }
        if wr.sgl.len() > e.cap.max_recv_sge.max(1) as usize {
            return Err(DatError::invalid_arg(2));
        }
        if e.rq.len() >= e.cap.max_recv_wr as usize {
            return Err(DatError::resources(SubType::None));
        }
        e.rq.push_back(wr);
        if let Some(t) = e.conn {
            self.retry_held(sh, t);
        }
        Ok(())
    }

    pub(crate) fn retry_held_for_srq(&mut self, sh: &Shared, srq: u64) {
        let tokens: Vec<u64> = self
            .qps
            .values()
            .filter(|e| e.srq.as_ref().map(|s| s.id == srq).unwrap_or(false))
            .filter_map(|e| e.conn)
            .collect();
        for t in tokens {
            self.retry_held(sh, t);
        }
    }

    /// Runs the requests held on connections whose output has drained (see `try_write`).
    pub(crate) fn retry_drained(&mut self, sh: &Shared) {
        // Retrying may drain the output again (until the socket is full or nothing is held).
        while !self.drained.is_empty() {
            for token in std::mem::take(&mut self.drained) {
                self.retry_held(sh, token);
            }
        }
    }

    /// Tries again the requests queued behind a send that had no receive, or behind an RDMA
    /// read that waited for our output to drain.
    fn retry_held(&mut self, sh: &Shared, token: u64) {
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            let Phase::Established { qp } = c.phase else {
                return;
            };
            let Some((h, p)) = c.held.pop_front() else {
                break;
            };
            c.held_bytes = c.held_bytes.saturating_sub(p.len());
            match self.target_request(sh, token, qp, &h, &p) {
                Outcome::Done => {}
                Outcome::Hold => {
                    if let Some(c) = self.conns.get_mut(&token) {
                        c.held_bytes += p.len();
                        c.held.push_front((h, p));
                    }
                    // It may wait for the answers just queued to drain: send them now.
                    self.try_write(token);
                    self.wake_needed = true;
                    return;
                }
                Outcome::Broken => return,
            }
        }
        // Frames decoded but not processed while holding, and reading resumes.
        self.process_frames(sh, token);
        self.wake_needed = true;
    }

    // ---- the wire ------------------------------------------------------------------------------

    fn answer(&mut self, token: u64, h: Header, payload: Vec<u8>) {
        if let Some(c) = self.conns.get_mut(&token) {
            c.out.push_frame(h, payload);
        }
    }

    /// Executes a SEND, WRITE or READ_REQ from the peer, in order.
    fn target_request(
        &mut self,
        sh: &Shared,
        token: u64,
        qp: u32,
        h: &Header,
        p: &[u8],
    ) -> Outcome {
        let Some(e) = self.qps.get_mut(&qp) else {
            return Outcome::Broken;
        };
        let pd = e.pd;
        match h.kind {
            Kind::Send => {
                let (wr, pd) = match &e.srq {
                    Some(s) => (s.queue.lock().pop_front(), s.pd),
                    None => (e.rq.pop_front(), pd),
                };
                let Some(wr) = wr else { return Outcome::Hold };
                let rcq = e.recv_cq.clone();
                let placed = sh.keys.lock().scatter(&wr.sgl, pd, p);
                let status = match placed {
                    Ok(()) => WcStatus::Success,
                    Err(s) => s,
                };
                self.push_wc(
                    &rcq,
                    WorkCompletion {
                        wr_id: wr.wr_id,
                        status,
                        opcode: WcOpcode::Recv,
                        byte_len: if status == WcStatus::Success {
                            p.len() as u32
                        } else {
                            0
                        },
                        qp_num: qp,
                        new_rkey: 0,
                    },
                );
                let mut ack = Header::new(Kind::Ack);
                ack.seq = h.seq;
                ack.status = match status {
                    WcStatus::Success => Status::Ok,
                    WcStatus::LocalLength => Status::RemoteLength,
                    _ => Status::RemoteAccess,
                };
                self.answer(token, ack, Vec::new());
                if status != WcStatus::Success {
                    self.break_after_answer(token, qp);
                    return Outcome::Broken;
                }
                Outcome::Done
            }
            Kind::Write => {
                let r = sh.keys.lock().remote_write(h.key, h.addr, pd, p);
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
            Kind::ReadReq => {
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
                    .filter(|c| c.out.is_empty() && !c.write_failed && !c.is_closing())
                    .map(|c| c.stream.as_raw_fd());
                let r = match direct {
                    Some(fd) => {
                        let mut full = resp;
                        full.payload_len = h.length;
                        let head = full.encode();
                        let sent = sh
                            .keys
                            .lock()
                            .remote_read_to_socket(h.key, h.addr, h.length, pd, fd, &head);
                        sent.map(|(sent, rest)| {
                            if let Some(c) = self.conns.get_mut(&token) {
                                if sent < head.len() {
                                    c.out.push_bytes(head[sent..].to_vec());
                                }
                                c.out.push_bytes(rest);
                            }
                        })
                    }
                    None => sh
                        .keys
                        .lock()
                        .remote_read(h.key, h.addr, h.length, pd)
                        .map(|data| self.answer(token, resp, data)),
                };
                match r {
                    Ok(()) => Outcome::Done,
                    Err(s) => {
                        log::info!("qp {qp}: remote read refused (rkey {:#x})", h.key);
                        resp.status = s;
                        self.answer(token, resp, Vec::new());
                        self.break_after_answer(token, qp);
                        Outcome::Broken
                    }
                }
            }
            _ => Outcome::Broken,
        }
    }

    /// An ACK or READ_RESP for our oldest outstanding request.
    /// `placed`: the payload of a READ_RESP was already placed (by a `ReadSink`), with
    /// this outcome.
    fn response(&mut self, sh: &Shared, qp: u32, h: &Header, p: &[u8], placed: Option<WcStatus>) {
        let Some(e) = self.qps.get_mut(&qp) else {
            return;
        };
        let pd = e.pd;
        let matches = match e.outstanding.front() {
            Some(o) => {
                o.local.is_none()
                    && o.seq == h.seq
                    && (h.kind == Kind::ReadResp) == (o.opcode == WcOpcode::RdmaRead)
            }
            None => false,
        };
        if !matches {
            log::warn!("qp {qp}: response does not match the oldest request; breaking");
            self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
            return;
        }
        let Some(o) = e.outstanding.pop_front() else {
            return;
        };
        let status = match h.status {
            Status::Ok => {
                if let Some(status) = placed {
                    status
                } else if h.kind == Kind::ReadResp {
                    if p.len() != o.len as usize {
                        WcStatus::BadResponse
                    } else {
                        match sh.keys.lock().scatter(&o.read_sgl, pd, p) {
                            Ok(()) => WcStatus::Success,
                            Err(s) => s,
                        }
                    }
                } else {
                    WcStatus::Success
                }
            }
            Status::RemoteAccess => WcStatus::RemoteAccess,
            Status::RemoteLength | Status::RemoteInvalid => WcStatus::RemoteInvalidRequest,
            Status::BadVersion => WcStatus::BadResponse,
        };
        self.complete(qp, &o, status);
        if status != WcStatus::Success {
            self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp }));
            return;
        }
        if o.opcode == WcOpcode::RdmaRead {
            self.start_fenced(sh, qp);
        }
        self.complete_local_heads(qp);
    }

    /// The peer broke the protocol: its connection (only) goes.
    fn protocol_error(&mut self, token: u64, why: &str) {
        log::warn!("connection {token}: protocol error: {why}");
        let Some(c) = self.conns.get(&token) else {
            return;
        };
        match c.phase {
            Phase::Established { qp } => self.fail_qp(qp, Some(CmEvent::Broken { qp_num: qp })),
            Phase::ActiveAwaitReply { qp } => self.fail_qp(
                qp,
                Some(CmEvent::Rejected {
                    qp_num: qp,
                    private_data: Vec::new(),
                    by_peer: false,
                }),
            ),
            Phase::PassiveRequested { listener } => {
                self.conns.remove(&token);
                self.emit(CmEvent::RequestCancelled {
                    listener,
                    req: token,
                });
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
    fn conn_lost(&mut self, token: u64) {
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
                self.fail_qp(
                    qp,
                    Some(CmEvent::Rejected {
                        qp_num: qp,
                        private_data: Vec::new(),
                        by_peer: false,
                    }),
                );
            }
            Phase::PassiveRequested { listener } => {
                self.emit(CmEvent::RequestCancelled {
                    listener,
                    req: token,
                });
            }
            Phase::PassiveAwaitHello { .. } | Phase::Closing => {}
        }
    }

    fn process_frames(&mut self, sh: &Shared, token: u64) {
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
                    c.phase = Phase::PassiveRequested { listener };
                    c.deadline = None;
                    let (remote, local) = (v4(c.stream.peer_addr()), v4(c.stream.local_addr()));
                    match (remote, local) {
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
                Phase::PassiveRequested { .. } => {
                    self.protocol_error(token, "data before accept");
                    return;
                }
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
                    Kind::Send | Kind::Write | Kind::ReadReq => {
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
    fn take_over_read(&mut self, sh: &Shared, token: u64) {
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
    fn read_sink(&mut self, sh: &Shared, token: u64, buf: &mut [u8]) -> SinkStep {
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

    fn accept_incoming(&mut self, listener: u64) {
        for _ in 0..64 {
            let Some(l) = self.listeners.get(&listener) else {
                return;
            };
            match l.sock.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    tune(&stream);
                    let token = self.token();
                    self.conns.insert(
                        token,
                        Conn::new(
                            stream,
                            Phase::PassiveAwaitHello { listener },
                            Some(Instant::now() + HELLO_TIMEOUT),
                        ),
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::warn!("accept on listener {listener}: {e}");
                    return;
                }
            }
        }
    }

    fn check_deadlines(&mut self) {
        let now = Instant::now();
        let expired_conns: Vec<(u64, Phase)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.map(|d| d <= now).unwrap_or(false))
            .map(|(t, c)| (*t, c.phase))
            .collect();
        for (t, phase) in expired_conns {
            match phase {
                Phase::ActiveAwaitReply { qp } => {
                    self.fail_qp(qp, Some(CmEvent::TimedOut { qp_num: qp }));
                }
                _ => {
                    self.conns.remove(&t);
                }
            }
        }
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

enum Target {
    Wake,
    Listener(u64),
    Conn(u64),
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
