//! The progress engine of the TCP transport: the state one progress thread owns (queue pairs,
//! connections, listeners) and what it does with it, one concern a file:
//!
//! * this file: the engine's state and the queue pairs (create, flush, fail, reset, destroy);
//! * `connection`: connect, listen, accept, reject, disconnect, deadlines, lost peers;
//! * `initiator`: posted requests become frames, in order; answers complete them;
//! * `target`: a peer's requests executed against our registered memory;
//! * `sockets`: reading and writing frames, and the progress thread's poll loop;
//! * `datagram`: unreliable datagram QPs (UDP) and their address resolution;
//! * `samehost`: the same-host path's handshake, and RDMA reads and writes it does at once.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::sys::{self, PollFd, POLLERR, POLLHUP, POLLIN, POLLNVAL, POLLOUT, POLLRDHUP};
use super::wire::{self, Decoder, Header, Kind, OutQueue, Status};
use crate::completions::Completions;
use crate::poll_wait::POLL_LEASE;
use crate::readiness::{Parked, Watched};
use crate::receives::SharedReceives;
use crate::shared::Shared;
use daplrs_backend::intmap::IntMap;
use daplrs_backend::{
    CmEvent, Error, QpCap, QpState, RecvWr, Resource, Result, SendOp, SendWr, Sge, WcOpcode,
    WcStatus, WorkCompletion, WrContext,
};

mod budget;
mod connection;
mod datagram;
mod initiator;
mod lane;
mod liveness;
mod progress;
mod samehost;
mod signalled;
mod sockets;
mod target;

use budget::Charge;
pub(crate) use budget::PeerMemory;
pub(crate) use datagram::TcpAh;
pub(crate) use lane::Lane;
pub(crate) use progress::progress_loop;

/// A peer that has not sent its whole HELLO by then is dropped (a legitimate peer sends it
/// with its connect).
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections of one listener that have not sent their HELLO yet: past this many, the oldest
/// is dropped for each new one, so stalled connections cannot keep a legitimate peer out.
const MAX_AWAITING_HELLO: usize = 256;
/// Connection requests of one listener that the consumer has neither accepted nor rejected:
/// past this many, a new HELLO is refused (REJECT, status REMOTE_INVALID) and closed.
pub(crate) const MAX_PENDING_REQUESTS: usize = 1024;
/// A driver claims up to this many parked connections of a CQ one by one, more by their
/// parked set (`Engine::claim_parked_sets`).
const CLAIM_ALONE_UPTO: usize = 8;
/// How long a listener rests after accept ran out of descriptors.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Target-side requests queued behind a send that waits for a receive; past this many bytes we
/// stop reading the socket (back-pressure instead of unbounded buffering). Each held request
/// counts its payload and `HELD_OVERHEAD`, so that payload-less ones (READ_REQ) count too.
const HOLD_LIMIT: usize = 8 << 20;
const HELD_OVERHEAD: usize = std::mem::size_of::<(Header, Vec<u8>)>() + 16;
/// Answers (ACK, READ_RESP) a peer may leave unread: past this many, its further requests are
/// held (and past HOLD_LIMIT, no longer read) until it reads them. A legitimate peer has no
/// more requests outstanding than its send queue holds (at most max_qp_wr, 2^18; past this
/// many unread, its further requests only wait).
const MAX_ANSWERS_PENDING: usize = 65536;
/// How long messages a peer sent before it went away wait for the consumer's receives: then
/// they are dropped and the end of the connection reported.
const END_GRACE: Duration = Duration::from_secs(2);
/// How often a connection held back past HOLD_LIMIT is still read (one read, up to 256 KiB,
/// each time: 2.5 MiB/s at most), so that a peer that left is seen within seconds, while one
/// that stays and sends on needs 25 s of a consumer posting no receives to fill the default
/// budget alone.
const TRICKLE_EVERY: Duration = Duration::from_millis(100);
/// Poll timeout: the granularity of connection deadlines.
const TICK_MS: i32 = 50;
/// How long a same-host connection's ring stays idle before it parks (`Conn::parkable`).
const RING_PARK_AFTER: std::time::Duration = std::time::Duration::from_millis(10);
/// Socket send buffer asked for (see `tune`).
const SEND_BUFFER: i32 = 4 << 20;
/// How long a closing connection may take to send what is left and then to see the peer's end
/// of stream. Closing a socket that still has unread input makes the kernel reset the
/// connection, and a reset discards what the peer has not read yet (our last answers): so a
/// closing connection keeps reading and discarding until the peer closes too, for this long.
const CLOSE_LINGER: Duration = Duration::from_secs(5);

pub(crate) enum Deferred {
    Notify(Arc<Completions>),
    Cm(CmEvent),
    /// The driver of this CQ must look at its connections again (output is waiting).
    Interrupt(u64),
}

pub(crate) struct ListenerEntry {
    pub sock: TcpListener,
}

impl Drop for ListenerEntry {
    /// However a listener leaves the engine (its close, the device's): the progress thread
    /// may be in poll() on it, so its port is free only if stopped here
    /// (`sys::stop_listening`), not when that thread next runs.
    fn drop(&mut self) {
        sys::stop_listening(self.sock.as_raw_fd());
    }
}

struct Outstanding {
    wr_id: u64,
    /// The consumer's record of the request, given back with its completion.
    ctx: WrContext,
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
    send_cq: Arc<Completions>,
    recv_cq: Arc<Completions>,
    srq: Option<Arc<SharedReceives>>,
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
    /// A datagram QP's socket (None: a connected QP).
    ud: Option<datagram::UdQp>,
    /// Our requests on the connection that consume a receive of the peer's (sends, writes
    /// with immediate data): the number of the peer's receive the next one consumes, which
    /// the peer may have published for us to place a send in (samehost/ring.rs). While the
    /// lane has the QP's sends, its count is the current one (`close_lane` takes it back).
    sent_to_recvs: u64,
    /// Our receives the peer's requests consumed on the connection: the number of the next.
    recvs_done: u64,
    /// Our posted receives, published in our same-host ring for the peer to place its sends
    /// in (engine/samehost.rs).
    recv_window: Option<samehost::RecvWindow>,
    /// Both sides agreed on the same-host path and our offer waits for the QP's first
    /// request (engine/samehost.rs, "set up at first use").
    offer_on_post: bool,
    /// The QP's RDMA reads and writes, and sends placed in the peer's receives, done without
    /// the engine while it is open (lane.rs).
    lane: Arc<Lane>,
}

impl QpEntry {
    /// Closes the QP's lane (lane.rs), waiting for a post under way, and takes back the count
    /// of the peer's receives the lane's sends consumed.
    fn close_lane(&mut self) {
        if let Some(next) = self.lane.close() {
            self.sent_to_recvs = next;
        }
    }

    /// Takes the receive the peer's next message consumes (from the SRQ if the QP has one),
    /// with the PD it is placed under and whether it came from the QP's own queue.
    #[inline]
    fn take_receive(&mut self) -> Option<(RecvWr, u32, bool)> {
        match &self.srq {
            Some(s) => s.queue.lock().pop_front().map(|wr| (wr, s.pd, false)),
            None => self.rq.pop_front().map(|wr| (wr, self.pd, true)),
        }
    }

    /// Whether a receive is posted for the peer's next message.
    #[inline]
    fn has_receive(&self) -> bool {
        match &self.srq {
            Some(s) => !s.queue.lock().is_empty(),
            None => !self.rq.is_empty(),
        }
    }
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
    /// Datagram address resolution `id` (see `datagram`): HELLO sent, waiting for ACCEPT.
    UdAwaitReply {
        id: u64,
    },
    /// A datagram QP's HELLO arrived (its QP number `qpn`); waiting for the consumer.
    PassiveUdRequested {
        listener: u64,
        qpn: u32,
    },
}

struct Conn {
    /// In its receive CQ's parked set (readiness.rs), which the progress thread watches
    /// nested in its set of returned connections unless a driver holds it (see
    /// `release_cq_claims`). Declared first, so that a dropped connection leaves the set
    /// before its socket closes.
    parked: Option<Parked>,
    /// In the readiness sets of its QP's CQs, for their pollers (readiness.rs): while
    /// established. Before the socket too, for the same reason.
    watched: Option<Watched>,
    stream: TcpStream,
    phase: Phase,
    dec: Decoder,
    out: OutQueue,
    held: VecDeque<(Header, Vec<u8>)>,
    held_bytes: usize,
    /// This connection's share of the device's budget (budget.rs).
    charge: Charge,
    /// The peer shut its side (seen while its input was held back): what it sent before is
    /// read whatever is held, up to its end of stream.
    peer_closing: bool,
    /// The peer's end (of stream, or its DISCONNECT) came while messages were held: reported
    /// once they are received or at the deadline (END_GRACE), whichever is first.
    peer_end: Option<PeerEnd>,
    /// Held back (past HOLD_LIMIT), the socket is still read a little, no sooner than this:
    /// see `wants_input`.
    trickle_at: Option<Instant>,
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
    /// Stream positions (`OutQueue::pushed`) where answers we queued end, oldest first, not
    /// yet known to be written (see `answers_pending`), and how many bytes each queued.
    answer_ends: VecDeque<(u64, usize)>,
    /// Bytes of those answers.
    answer_bytes: usize,
    /// The same-host path on this connection (engine/samehost.rs).
    same_host: super::samehost::Link,
    /// When a polling consumer last read this connection itself (`TcpCq::progress`): for
    /// `POLL_LEASE` after it, the progress thread leaves a same-host ring alone and does not
    /// spin for what it read here; for `QUIET_LEASE`, the socket may stay quiet.
    last_look: Option<Instant>,
    /// When frames last came through our same-host ring (`parkable`).
    ring_read_at: Option<Instant>,
    /// The socket's receive low-water mark is raised: its small frames wake no poller (see
    /// `Engine::settle_quiet`).
    quiet: bool,
    /// The socket's receive buffer size, read at the first raise (0: not yet).
    rcvbuf: i32,
    /// Armed for the target signal (../sigio.rs): its input is read by signal handlers, by
    /// a thread driving it, or by the progress thread when a handler left something
    /// (`Engine::sweep_signalled`), not watched in the progress thread's poll set.
    signalled: bool,
    /// Its ACKs held for our next frame wait for the ACK timer (signalled.rs): not output
    /// due before (`output_due`).
    acks_wait: bool,
    /// The signal is on now (O_ASYNC): off while a thread of ours polls or waits on the
    /// connection itself, which reads its input anyway and which a signal only interrupts.
    /// Off, the connection is watched and kept quiet as any other.
    armed: bool,
    /// The thread its signal goes to: the last application thread that posted on it and
    /// takes the signal (`Engine::note_poster`); None: any thread of the process.
    signal_owner: Option<i32>,
}

/// How a peer's stream ended while messages were held (`Conn::peer_end`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeerEnd {
    /// End of stream or reset: the connection is lost.
    Lost,
    /// A DISCONNECT frame: a graceful disconnect.
    Disconnect,
}

/// The rest of a large payload goes from the socket straight into local buffers (one copy,
/// the kernel's, instead of two): a READ_RESP into the SGL of the read it answers, a SEND
/// into the receive it is for, a WRITE into the memory it names.
struct ReadSink {
    qp: u32,
    header: Header,
    sgl: Vec<Sge>,
    pd: u32,
    got: usize,
    /// A local error met on the way (the rest of the payload is then read and dropped).
    failed: Option<WcStatus>,
    /// What the payload completes.
    purpose: SinkFor,
}

#[derive(Clone, Copy)]
enum SinkFor {
    /// The answer to our oldest RDMA read (`response`).
    ReadAnswer,
    /// A peer's SEND into the receive at the front of the QP's own queue, `wr_id`, which stays
    /// there until the message is in (so a flush meanwhile completes it: nothing is lost).
    Message { wr_id: u64 },
    /// A peer's WRITE into the memory its header's rkey and address name.
    Write,
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
    /// Our same-host ring for the peer's frames, from when we offered it (not only once the
    /// peer's SWITCH has been read: another thread may read that SWITCH from under a driver
    /// whose poll then sees nothing, and only a driver counted on the ring gets a doorbell).
    pub ring: Option<Arc<super::samehost::ring::Ring>>,
    /// The peer's same-host ring, when our frames go there (then output waits for room in
    /// it, not in the socket).
    pub ring_out: Option<Arc<super::samehost::ring::Ring>>,
}

impl Conn {
    fn new(stream: TcpStream, phase: Phase, deadline: Option<Instant>, charge: Charge) -> Conn {
        Conn {
            parked: None,
            watched: None,
            stream,
            phase,
            dec: Decoder::new(),
            out: OutQueue::default(),
            held: VecDeque::new(),
            held_bytes: 0,
            charge,
            peer_closing: false,
            peer_end: None,
            trickle_at: None,
            deadline,
            close_when_flushed: false,
            draining: false,
            write_failed: false,
            driven: None,
            sink: None,
            wait_drain: false,
            answer_ends: VecDeque::new(),
            answer_bytes: 0,
            same_host: Default::default(),
            last_look: None,
            ring_read_at: None,
            quiet: false,
            rcvbuf: 0,
            signalled: false,
            acks_wait: false,
            armed: false,
            signal_owner: None,
        }
    }

    /// Notes that the answer just queued, `bytes` of it still to write, ends at the current
    /// end of the output.
    fn note_answer(&mut self, bytes: usize) {
        let end = self.out.pushed();
        if end > self.out.written() {
            self.answer_ends.push_back((end, bytes));
            self.answer_bytes += bytes;
        }
    }

    /// How many of our answers the peer has not taken yet.
    fn answers_pending(&mut self) -> usize {
        let written = self.out.written();
        while let Some(&(end, bytes)) = self.answer_ends.front() {
            if end > written {
                break;
            }
            self.answer_ends.pop_front();
            self.answer_bytes -= bytes;
        }
        self.answer_ends.len()
    }

    /// Whether to read more from the peer: not after its end; while its held requests are
    /// over the limit, once per TRICKLE_EVERY (unless it has shut its side: the rest is
    /// bounded by the socket's buffer). A peer that left with a plain close has its end of
    /// stream behind the data we do not read, and a peer's kernel keeps answering our shut
    /// window for it forever: only reading on reaches the end. What is read on is held
    /// against the device's budget like anything else, so a peer that does not end only
    /// reaches it sooner (its connection then breaks, as an RNR retry count runs out).
    fn wants_input(&self) -> bool {
        let held_back = self.held_bytes > HOLD_LIMIT
            && !self.peer_closing
            && self.trickle_at.is_some_and(|t| Instant::now() < t);
        !held_back && self.peer_end.is_none()
    }

    /// After a read: past the hold limit, the next one waits TRICKLE_EVERY.
    fn pace_input(&mut self) {
        self.trickle_at = (self.held_bytes > HOLD_LIMIT && !self.peer_closing)
            .then(|| Instant::now() + TRICKLE_EVERY);
    }

    /// Whether to watch a connection whose input is held back for its peer's end, so that a
    /// peer that leaves with messages held is noticed (POLLRDHUP).
    fn watch_for_end(&self) -> bool {
        !self.wants_input()
            && self.peer_end.is_none()
            && matches!(self.phase, Phase::Established { .. })
    }

    /// Whether the progress thread may watch it in its set of returned connections, which
    /// watches for input only (the socket, and the bell of our same-host ring once the peer's
    /// frames come through it): nothing to write, input wanted, and not between our ring's
    /// offer and the peer's SWITCH (which comes on the socket: `same_host_switch`).
    fn returnable(&self) -> bool {
        !self.signalled
            && self.out.is_empty()
            && self.wants_input()
            && (self.same_host.incoming.is_none() || self.same_host.reading_ring().is_some())
    }

    /// Whether it may wait in its receive CQ's parked set now (`returnable`). A same-host
    /// connection parks once its ring has been idle for `RING_PARK_AFTER`: parked, its
    /// writer rings the bell for each frame and a waiting thread claims it out of the set and
    /// back at each wait (four `epoll_ctl`s: 8 B blocking sends 4-5 us one-way before, 9 us
    /// parking at each wait), both dear next to the ring's microseconds.
    fn parkable(&self, now: Instant) -> bool {
        self.returnable()
            && (self.same_host.incoming.is_none()
                || self
                    .ring_read_at
                    .is_none_or(|at| now >= at + RING_PARK_AFTER))
    }

    /// Whether it has output to write now: not when all it has is ACKs held for our next
    /// frame while the ACK timer runs (engine/signalled.rs), unless something waits for
    /// them to be gone.
    fn output_due(&self) -> bool {
        let held_only = self.acks_wait
            && self.out.only_held_acks()
            && !self.wait_drain
            && !self.close_when_flushed;
        !self.out.is_empty() && !held_only
    }

    /// Whether a thread of the application may read it: established, its writes not failed,
    /// and driven by nobody or by `driver` (a waiting thread's CQ).
    fn open_to(&self, driver: Option<u64>) -> bool {
        (self.driven.is_none() || self.driven == driver)
            && !self.write_failed
            && matches!(self.phase, Phase::Established { .. })
    }

    fn is_closing(&self) -> bool {
        self.phase == Phase::Closing
    }

    /// Sends what the kernel takes now (never raising SIGPIPE); on a same-host connection,
    /// everything after our SWITCH frame goes into the peer's ring instead (with its bell, or
    /// a doorbell on the socket, when a thread of the peer may be asleep on it).
    fn flush_out(&mut self) -> io::Result<()> {
        let fd = self.stream.as_raw_fd();
        if let Some(at) = self.same_host.switch_at {
            self.out.write_upto(at, |s| sys::send_nosignal(fd, s))?;
            self.same_host.switch_at = None;
        }
        if self.out.holds_acks() {
            use crate::sigio::stats;
            match self.out.only_held_acks() {
                true => stats::add(&stats::HELD_ALONE, 1),
                false => stats::add(&stats::HELD_WITH_FRAME, 1),
            }
        }
        let Some(ring) = self.same_host.writing_ring() else {
            return send_out(&mut self.out, &self.stream);
        };
        let mut turn = ring.writer_turn();
        let before = self.out.written();
        let result = self.out.write_with(|s| ring.write(s));
        // What is left may end in part of a frame: a lane's frames wait for it (lane.rs).
        turn.engine_behind = !self.out.is_empty();
        drop(turn);
        if self.out.written() != before && ring.reader_needs_bell(POLL_LEASE) {
            wake_ring_reader(ring, fd);
        }
        result
    }

    /// Makes the peer's frames raise the target signal, if it is on (../sigio.rs), with the
    /// room a handler's ACK may need.
    fn arm_signal(&mut self) {
        if crate::sigio::signal().is_some() {
            self.signalled = crate::sigio::arm(self.stream.as_raw_fd());
            self.armed = self.signalled;
            self.out.keep_ack_room();
        }
    }

    /// Turns the target signal of a signalled connection on or off (`armed`); on, its socket
    /// is no longer quiet, or the kernel would raise no signal for small frames.
    fn set_armed(&mut self, on: bool) {
        if !self.signalled || self.armed == on {
            return;
        }
        if on {
            self.set_quiet(false);
        }
        crate::sigio::set_async(self.stream.as_raw_fd(), on);
        self.armed = on;
    }

    /// Ends the connection after what is queued has been sent: the peer reads everything up
    /// to our last frame, then our end of stream. Frames from the peer are no longer processed.
    fn begin_close(&mut self) {
        self.phase = Phase::Closing;
        self.watched = None;
        self.close_when_flushed = true;
        self.held.clear();
        self.held_bytes = 0;
        self.peer_end = None;
        self.sink = None;
        self.recharge();
        self.deadline = Some(Instant::now() + CLOSE_LINGER);
    }
}

/// Writes `out` to `stream` until done or the socket refuses, with sendmsg(MSG_NOSIGNAL): a
/// library must not raise SIGPIPE in its host when a peer has gone away.
pub(super) fn send_out(out: &mut OutQueue, stream: &TcpStream) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    out.write_with(|slices| sys::send_nosignal(fd, slices))
}

/// Wakes the peer's threads asleep in poll on `ring` (the peer's, which we write) through its
/// bell, or, if we could not take the bell, with a doorbell on the connection's socket `fd`:
/// one byte that means nothing (after our SWITCH, the socket carries nothing else). A full
/// socket or a gone peer needs no doorbell: the first is being read, the second is seen by
/// reading.
fn wake_ring_reader(ring: &super::samehost::ring::Ring, fd: std::os::fd::RawFd) {
    if !ring.ring_bell() {
        let _ = sys::send_nosignal(fd, &[std::io::IoSlice::new(&[0u8])]);
    }
}

/// What a held request of `payload_len` bytes counts against HOLD_LIMIT and the budget.
fn held_cost(payload_len: usize) -> usize {
    HELD_OVERHEAD + payload_len
}

enum Outcome {
    Done,
    Hold,
    Broken,
}

#[derive(Default)]
pub(crate) struct Engine {
    qps: IntMap<u32, QpEntry>,
    conns: IntMap<u64, Conn>,
    /// When `check_deadlines` last walked the connections (`DEADLINE_GRAIN`).
    deadlines_checked: Option<Instant>,
    pub(crate) listeners: IntMap<u64, ListenerEntry>,
    pub(crate) connect_results: Vec<(u32, u64, io::Result<TcpStream>)>,
    /// Connects under way, by QP (`connect_started`).
    connecting: IntMap<u32, connection::Connecting>,
    next_token: u64,
    next_qp: u32,
    pub(crate) deferred: Vec<Deferred>,
    pub(crate) wake_needed: bool,
    /// Frames served by signal handlers (../sigio.rs), and what they left for the next
    /// ordinary holder: CQs to notify, spent receives to free (`take_signalled`).
    pub(crate) signalled_frames: u64,
    /// A handler left a frame (or a driver a connection) for the progress thread to read.
    pub(crate) signal_sweep: bool,
    signalled_cqs: Vec<Arc<Completions>>,
    signalled_rqs: Vec<RecvWr>,
    /// The device's slot among those signal handlers serve (../sigio.rs), which names its
    /// ACK timer; whether that timer runs for ACKs handlers hold (signalled.rs).
    pub(crate) signal_slot: Option<usize>,
    ack_timer_armed: bool,
    /// When the running ACK timer fires.
    ack_timer_due: Option<Instant>,
    /// The thread the ACK timer's signal goes to (None: the process), the last to take a
    /// connection's signal (`note_poster`).
    ack_timer_thread: Option<i32>,
    /// Poster threads gone when our connections' signal owners were last checked
    /// (`forget_exited_posters`).
    posters_exited_seen: usize,
    /// Connections whose last write failed, to be read out and then reported lost.
    failed_writes: Vec<u64>,
    /// The progress thread's set of returned connections (`release_cq_claims`); None if
    /// epoll(7) was refused (then they go back into its poll set).
    returned_set: Option<Arc<sys::Epoll>>,
    /// The progress thread polls without the connections drivers had claimed.
    poll_excludes: bool,
    /// CQs whose parked set (readiness.rs) is in `returned_set`, by id (not kept alive by
    /// it: a CQ freed takes its set out of `returned_set` as it closes); watched there unless
    /// in `claimed_sets`.
    nested: IntMap<u64, std::sync::Weak<Completions>>,
    /// CQs whose parked set a driver holds, by id: the CQ and the driver's CQ.
    claimed_sets: IntMap<u64, (Arc<Completions>, u64)>,
    /// Per CQ, the CQs that receive for its QPs and how many of its QPs each receives for
    /// (a driver of the CQ claims their parked sets).
    receivers: IntMap<u64, Vec<(Arc<Completions>, usize)>>,
    /// Per driver's CQ, the connections it claimed one by one.
    driven_by: IntMap<u64, Vec<u64>>,
    /// Connections whose output drained while requests were held behind it.
    drained: Vec<u64>,
    /// Per listener, its connections in the order accepted that may still await their HELLO
    /// (see MAX_AWAITING_HELLO).
    awaiting_hello: IntMap<u64, VecDeque<u64>>,
    /// Listeners not polled until then: accepting failed for lack of descriptors (EMFILE,
    /// ENFILE), and the connection waiting in the kernel's queue would wake us at once again.
    pub(crate) accept_paused: IntMap<u64, Instant>,
    /// Panics caught while serving a connection (each dropped that connection only).
    pub(crate) panics: u64,
    /// Frames received and handled, by any thread (the progress thread spins only after it
    /// handled some itself: see `ProgressThread::serve` in progress.rs).
    pub(crate) frames_served: u64,
    /// The peer's reads, writes and atomics taken on, by any thread (the progress thread
    /// spins while a polling application serves them: see `PollSet::gather` in progress.rs).
    pub(crate) requests_served: u64,
    /// Tests: a request naming this rkey panics the target (to check the containment).
    #[cfg(test)]
    pub(crate) panic_on_rkey: Option<u32>,
    /// Datagram address resolutions under way, by id.
    ud_pending: IntMap<u64, datagram::UdResolve>,
    /// The datagram QPs (`ud_sockets` polls them without a walk of every QP).
    ud_qps: daplrs_backend::intmap::IntSet<u32>,
    /// Their TCP connects, as the helper threads finish them.
    pub(crate) ud_connect_results: Vec<(u64, io::Result<TcpStream>)>,
    /// Our HELLOs advertise the same-host path (the device can offer its key table).
    same_host_hello: bool,
    /// What peers may make this device hold (budget.rs).
    peer_memory: Arc<PeerMemory>,
}

fn v4(a: io::Result<SocketAddr>) -> Option<SocketAddrV4> {
    match a {
        Ok(SocketAddr::V4(v)) => Some(v),
        _ => None,
    }
}

/// Socket options of every connection: no Nagle delay (requests and answers are small and
/// latency-bound), and a send buffer that takes a large answer in one write, so it goes out
/// straight from registered memory rather than through a copy queued for later; and dead-peer
/// detection (`liveness::watch_peer`).
fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = sys::set_send_buffer(stream.as_raw_fd(), SEND_BUFFER);
    liveness::watch_peer(stream);
    liveness::reset_on_exit(stream);
}

fn bad_state() -> Error {
    Error::BadState
}

/// Requests the target answers with data (READ_RESP): RDMA reads and atomics. A fenced request
/// waits for these, as on an RDMA NIC.
fn answers_with_data(op: WcOpcode) -> bool {
    matches!(
        op,
        WcOpcode::RdmaRead | WcOpcode::FetchAdd | WcOpcode::CmpSwap
    )
}

/// How many reads and atomics a QP may have in flight: its max_rd_atomic (0 counts as 1, as
/// verbs rounds it up).
fn reads_allowed(cap: &QpCap) -> usize {
    cap.max_rd_atomic.max(1) as usize
}

impl Engine {
    /// An engine whose connects advertise the same-host path if `same_host_hello`.
    pub(crate) fn new(same_host_hello: bool) -> Engine {
        let mut eng = Engine {
            same_host_hello,
            returned_set: sys::Epoll::new()
                .map_err(|e| {
                    log::warn!("epoll: {e}; a wait's connections wake the progress thread")
                })
                .ok()
                .map(Arc::new),
            ..Engine::default()
        };
        eng.reserve_signalled();
        eng
    }

    pub(super) fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }

    pub(super) fn emit(&mut self, ev: CmEvent) {
        self.deferred.push(Deferred::Cm(ev));
    }

    pub(super) fn push_wc(&mut self, cq: &Arc<Completions>, wc: WorkCompletion) {
        cq.push(wc);
        self.deferred.push(Deferred::Notify(cq.clone()));
    }

    // ---- queue pairs ---------------------------------------------------------------------------

    pub(crate) fn create_qp(
        &mut self,
        pd: u32,
        send_cq: Arc<Completions>,
        recv_cq: Arc<Completions>,
        srq: Option<Arc<SharedReceives>>,
        cap: QpCap,
    ) -> u32 {
        self.next_qp += 1;
        let n = self.next_qp;
        self.note_receiver(&send_cq, &recv_cq, true);
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
                ud: None,
                sent_to_recvs: 0,
                recvs_done: 0,
                recv_window: None,
                offer_on_post: false,
                lane: Arc::default(),
            },
        );
        n
    }

    /// `qp`'s lane (lane.rs), which its `TcpQp` posts through.
    pub(crate) fn qp_lane(&self, qp: u32) -> Option<Arc<Lane>> {
        self.qps.get(&qp).map(|e| e.lane.clone())
    }

    /// The socket of `qp`'s connection (tests watch it for the peer's reset).
    #[cfg(test)]
    pub(crate) fn conn_fd(&self, qp: u32) -> Option<std::os::fd::RawFd> {
        let token = self.qps.get(&qp)?.conn?;
        self.conns.get(&token).map(|c| c.stream.as_raw_fd())
    }

    /// The established connections of the QPs that complete into CQ `cq` that no driver holds
    /// and whose writes have not failed: what a driver may claim, or a poller read.
    fn free_conns_of_cq(&self, cq: u64) -> Vec<u64> {
        self.conns_of_cq(cq, None)
    }

    /// The established, unfailed connections of the QPs that complete into CQ `cq`, driven by
    /// nobody or by `driven`.
    fn conns_of_cq(&self, cq: u64, driven: Option<u64>) -> Vec<u64> {
        self.qps
            .values()
            .filter(|e| e.send_cq.id == cq || e.recv_cq.id == cq)
            .filter_map(|e| e.conn)
            .filter(|t| self.conns.get(t).is_some_and(|c| c.open_to(driven)))
            .collect()
    }

    /// A QP completing into `send` and `recv` came (`add`) or went: `recv` receives for both.
    fn note_receiver(&mut self, send: &Arc<Completions>, recv: &Arc<Completions>, add: bool) {
        let cqs = if send.id == recv.id {
            vec![send.id]
        } else {
            vec![send.id, recv.id]
        };
        for cq in cqs {
            let list = self.receivers.entry(cq).or_default();
            match list.iter().position(|(r, _)| r.id == recv.id) {
                Some(i) if add => list[i].1 += 1,
                Some(i) => {
                    list[i].1 -= 1;
                    if list[i].1 == 0 {
                        list.swap_remove(i);
                    }
                }
                None if add => list.push((recv.clone(), 1)),
                None => {}
            }
            if list.is_empty() {
                self.receivers.remove(&cq);
            }
        }
    }

    /// Claims for a driver the established connections of the QPs that complete into CQ `cq`
    /// and nobody else drives (those its earlier drives of the same wait claimed stay its own
    /// until `release_cq_claims`).
    ///
    /// Parked connections (those that need only their input watched) are claimed by their
    /// set: the parked sets of the CQs that receive for the QPs of `cq` (returned, to poll)
    /// leave the progress thread's set of returned connections, one `epoll_ctl` each
    /// whatever the connections (one each, before, both ways, at every wait: 8 B blocking
    /// round trips on one of 1,024 connections took milliseconds).
    pub(crate) fn claim_for_cq(
        &mut self,
        completions: &Completions,
    ) -> (Vec<Claim>, Vec<Arc<Completions>>) {
        let cq = completions.id;
        let sets = self.claim_parked_sets(cq);
        let mut out = Vec::new();
        // The CQ's connections from its readiness sets, not a walk of every QP of the IA.
        let candidates = match completions.readiness.scan_all() {
            true => self.conns_of_cq(cq, Some(cq)),
            false => {
                let mut members = Vec::new();
                completions.readiness.members(&mut members);
                members
            }
        };
        for token in candidates {
            let Some(c) = self.conns.get_mut(&token) else {
                continue;
            };
            if !c.open_to(Some(cq)) {
                continue;
            }
            if let Some(p) = c.parked.as_ref() {
                match self.claimed_sets.get(&p.cq) {
                    Some((_, driver)) if *driver == cq => {
                        // Watched through its set; a quiet socket would not wake the
                        // driver for a small frame.
                        c.set_quiet(false);
                        continue;
                    }
                    Some(_) => continue, // in a set another driver holds: its connection
                    None => {}           // a set too small to claim whole: claimed alone
                }
            }
            let (input, output) = (c.wants_input(), c.output_due());
            if !input && !output {
                continue; // back-pressured: nothing to watch (see `PollSet::add_conn`)
            }
            // The driver sleeps in poll on it: a signal would only interrupt that poll.
            c.set_armed(false);
            if c.driven.replace(cq).is_none() {
                self.driven_by.entry(cq).or_default().push(token);
            }
            // Out of the progress thread's set of returned connections (without waking it):
            // the driver polls it now, and sleeps in poll on it, so every frame must wake it.
            c.parked = None;
            c.set_quiet(false);
            out.push(Claim {
                token,
                fd: c.stream.as_raw_fd(),
                input,
                output,
                ring: c.same_host.incoming.clone(),
                ring_out: c.same_host.writing_ring().cloned(),
            });
        }
        (out, sets)
    }

    /// Takes the parked sets of the CQs receiving for `cq`'s QPs out of the progress thread's
    /// set of returned connections, for `cq`'s driver; those it holds already (earlier
    /// drives of the same wait) stay its own, those another driver holds are left to it.
    fn claim_parked_sets(&mut self, cq: u64) -> Vec<Arc<Completions>> {
        let receivers: Vec<Arc<Completions>> = self
            .receivers
            .get(&cq)
            .map(|l| l.iter().map(|(r, _)| r.clone()).collect())
            .unwrap_or_default();
        let mut out = Vec::new();
        for r in receivers {
            let Some(fd) = r.readiness.parked_fd() else {
                continue; // nothing parked there yet
            };
            match self.claimed_sets.get(&r.id) {
                Some((_, driver)) if *driver == cq => {}
                Some(_) => continue,
                // A few connections are claimed one by one, as they were before: the set's
                // own descriptor would cost the driver an epoll_wait per wake-up.
                None if r.readiness.parked_count() <= CLAIM_ALONE_UPTO => continue,
                None => {
                    if self.nested.contains_key(&r.id) {
                        if let Some(top) = self.returned_set.as_ref() {
                            if let Err(e) = top.set_watching(fd, r.id, false) {
                                log::error!("epoll_ctl(MOD) of a parked set: {e}");
                                continue;
                            }
                        }
                    }
                    self.claimed_sets.insert(r.id, (r.clone(), cq));
                }
            }
            out.push(r);
        }
        out
    }

    /// Parks established connection `token` in its receive CQ's parked set, which the
    /// progress thread watches unless a driver holds it; false if it cannot be parked.
    pub(super) fn park(&mut self, token: u64) -> bool {
        let Some(c) = self.conns.get(&token) else {
            return false;
        };
        let Phase::Established { qp } = c.phase else {
            return false;
        };
        let Some(cq) = self.qps.get(&qp).map(|e| e.recv_cq.clone()) else {
            return false;
        };
        if self.returned_set.is_none() {
            return false;
        }
        let fd = c.stream.as_raw_fd();
        let ring = c.same_host.reading_ring().cloned();
        let Some(parked) = Parked::new(cq.id, cq.readiness.clone(), fd, token, ring) else {
            return false;
        };
        if let Some(c) = self.conns.get_mut(&token) {
            c.parked = Some(parked);
        }
        self.nest(&cq);
        true
    }

    /// Puts `cq`'s parked set into the progress thread's set of returned connections, unless
    /// it is there or a driver holds it.
    fn nest(&mut self, cq: &Arc<Completions>) {
        if self.nested.contains_key(&cq.id) || self.claimed_sets.contains_key(&cq.id) {
            return;
        }
        let (Some(top), Some(fd)) = (self.returned_set.as_ref(), cq.readiness.parked_fd()) else {
            return;
        };
        match top.add(fd, cq.id) {
            Ok(()) => {
                self.nested.retain(|_, w| w.strong_count() > 0);
                self.nested.insert(cq.id, Arc::downgrade(cq));
            }
            Err(e) => log::error!("epoll_ctl(ADD) of a parked set: {e}"),
        }
    }

    /// Whether connection `token` is parked (readiness.rs `Parked`).
    pub(crate) fn parked(&self, token: u64) -> bool {
        self.conns.get(&token).is_some_and(|c| c.parked.is_some())
    }

    /// The parked connections with input in the parked sets of the CQs `ids` (what the
    /// progress thread's set of returned connections reported).
    pub(super) fn parked_ready(&self, ids: &[u64], out: &mut Vec<u64>) {
        for id in ids {
            if let Some(cq) = self.nested.get(id).and_then(|w| w.upgrade()) {
                cq.readiness.parked_ready(out);
            }
        }
    }

    /// The connections of CQ `cq`'s QPs a polling consumer may read now (`TcpCq::progress`):
    /// established, not driven by a waiting thread, not failed.
    pub(crate) fn pollable_for_cq(&self, cq: u64) -> Vec<u64> {
        self.free_conns_of_cq(cq)
    }

    /// Whether a polling consumer may read connection `token` now (as `pollable_for_cq`).
    pub(crate) fn pollable(&self, token: u64) -> bool {
        self.conns.get(&token).is_some_and(|c| c.open_to(None))
    }

    /// Puts established connection `token` in the readiness sets of its QP's CQs
    /// (readiness.rs) as it reads now: its socket, or the same-host ring its frames come
    /// through once the peer switched to it.
    pub(super) fn rewatch(&mut self, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let Phase::Established { qp } = c.phase else {
            return;
        };
        let Some(e) = self.qps.get(&qp) else {
            return;
        };
        let mut sets = vec![e.send_cq.readiness.clone()];
        if e.recv_cq.id != e.send_cq.id {
            sets.push(e.recv_cq.readiness.clone());
        }
        // Out of the sets first: a socket is in a set once.
        c.watched = None;
        if c.same_host.offer_pending {
            // Its same-host path waits for its first request (samehost.rs): the progress
            // thread alone watches it until then. Only the peer's offer can come first, and
            // a look that asked the kernel about every such idle socket would pay a system
            // call each time while the busy connections are on rings.
            return;
        }
        let ring = c.same_host.reading_ring().cloned();
        c.watched = Some(match ring {
            Some(ring) => Watched::ring(sets, token, &ring),
            None => Watched::socket(sets, token, c.stream.as_raw_fd()),
        });
    }

    /// The wait of CQ `cq`'s driver ended: the connections it claimed go back to the progress
    /// thread, and the parked sets it held are watched in its set of returned connections
    /// again. Those it only needs to watch for input are parked (`park`): the set of returned
    /// connections is an epoll set whose descriptor is in its poll set, so it is woken if
    /// something is there to read, and not otherwise; the next wait claims them again
    /// (`claim_for_cq`), also without waking it. (Put back into its poll set instead, they
    /// were there again by the next wait, which claimed them without waking it; asleep in poll
    /// on the socket, it was woken by the answer along with the waiter, and on 2 CPUs took the
    /// waiter's: over veth, 6 in 10 of the blocking 8 B reads that took over 2.5x the median.)
    /// The others (output to write, input held back, a same-host ring) go back into its poll
    /// set, waking it if it polls without them, so that nothing arriving now waits for its
    /// next tick.
    pub(crate) fn release_cq_claims(&mut self, cq: u64) {
        let released: Vec<Arc<Completions>> = self
            .claimed_sets
            .values()
            .filter(|(_, driver)| *driver == cq)
            .map(|(set, _)| set.clone())
            .collect();
        for set in released {
            self.claimed_sets.remove(&set.id);
            let top = self.returned_set.as_ref();
            match (top, set.readiness.parked_fd()) {
                (Some(top), Some(fd)) if self.nested.contains_key(&set.id) => {
                    if let Err(e) = top.set_watching(fd, set.id, true) {
                        log::error!("epoll_ctl(MOD) of a parked set: {e}");
                    }
                }
                _ => self.nest(&set),
            }
        }
        let mut wake = false;
        let mut to_park = Vec::new();
        let now = Instant::now();
        for token in self.driven_by.remove(&cq).unwrap_or_default() {
            let Some(c) = self.conns.get_mut(&token) else {
                continue;
            };
            if c.driven != Some(cq) {
                continue;
            }
            c.driven = None;
            if c.signalled {
                // Signalled again; what came since the driver's last read is read by this
                // thread before it lets go of the engine (`Shared::sweep_if_asked`).
                c.set_armed(true);
                self.signal_sweep = true;
                continue;
            }
            if c.parkable(now) {
                to_park.push(token);
                continue;
            }
            wake |= c.output_due() || self.poll_excludes;
        }
        for token in to_park {
            if !self.park(token) {
                wake |= self.poll_excludes;
            }
        }
        if wake {
            self.wake_needed = true;
            self.poll_excludes = false;
        }
    }

    /// The progress thread's set of returned connections.
    pub(super) fn returned_set(&self) -> Option<&Arc<sys::Epoll>> {
        self.returned_set.as_ref()
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
    pub(super) fn flush_qp(&mut self, qp: u32) {
        let Some(e) = self.qps.get_mut(&qp) else {
            return;
        };
        // Every way out of Connected comes here: no read or write goes inline from now on.
        e.close_lane();
        // In post order: the started requests, then those waiting behind a fence.
        let mut sends: Vec<WorkCompletion> = e
            .outstanding
            .drain(..)
            .map(|o| WorkCompletion::flushed(o.wr_id, o.opcode, qp).with_ctx(o.ctx))
            .collect();
        sends.extend(
            e.fenced
                .drain(..)
                .map(|w| WorkCompletion::flushed(w.wr_id, w.op.opcode(), qp).with_ctx(w.ctx)),
        );
        if let Some(ud) = e.ud.as_mut() {
            sends.extend(
                ud.out
                    .drain(..)
                    .map(|o| WorkCompletion::flushed(o.wr_id, WcOpcode::Send, qp).with_ctx(o.ctx)),
            );
        }
        // Before the receives flush: no peer places a message in their buffers after, and
        // those it placed messages in (and completed its sends) complete first.
        let placed = e
            .recv_window
            .take()
            .map(|w| w.withdraw(e.recvs_done))
            .unwrap_or_default();
        let recvs: Vec<RecvWr> = e.rq.drain(..).collect();
        let (scq, rcq) = (e.send_cq.clone(), e.recv_cq.clone());
        for wc in sends {
            self.push_wc(&scq, wc);
        }
        for (i, r) in recvs.into_iter().enumerate() {
            // What the slot says was placed is the peer's word: never more than the receive.
            let capacity: u64 = r.sgl.iter().map(|s| u64::from(s.length)).sum();
            let placed = placed
                .get(i)
                .filter(|p| p.imm.is_some() || u64::from(p.len) <= capacity);
            let wc = match placed {
                Some(p) => WorkCompletion {
                    imm: p.imm,
                    solicited: p.solicited,
                    ..r.completion(
                        WcStatus::Success,
                        if p.imm.is_some() {
                            WcOpcode::RecvRdmaImm
                        } else {
                            WcOpcode::Recv
                        },
                        p.len,
                        qp,
                    )
                },
                None => r.flushed(qp),
            };
            self.push_wc(&rcq, wc);
        }
    }

    /// Moves `qp` to Error: drops its connection at once (no goodbye), flushes, reports `ev`.
    pub(super) fn fail_qp(&mut self, qp: u32, ev: Option<CmEvent>) {
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
        self.connecting.remove(&qp);
        self.flush_qp(qp);
        if let Some(ev) = ev {
            self.emit(ev);
        }
    }

    /// Target-side break after a failed request: the answer already queued still goes out,
    /// then the connection closes.
    pub(super) fn break_after_answer(&mut self, token: u64, qp: u32) {
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

    pub(crate) fn reset_qp(&mut self, qp: u32) -> Result<()> {
        let e = self.qps.get_mut(&qp).ok_or_else(bad_state)?;
        match e.state {
            QpState::Error | QpState::Init => {}
            // A ready datagram QP keeps its posted receives, as an Init one does.
            QpState::Connected if e.ud.is_some() => {}
            _ => return Err(bad_state()),
        }
        e.close_lane();
        e.conn = None;
        e.graceful_pending = false;
        e.remote = None;
        e.deadline = None;
        // A new connection numbers the receives anew (an Error QP's window went with its
        // flush).
        if let Some(w) = e.recv_window.take() {
            w.withdraw(e.recvs_done);
        }
        e.sent_to_recvs = 0;
        e.recvs_done = 0;
        if e.ud.is_some() {
            // A datagram QP needs no connection: reset, it is ready to send again.
            e.state = QpState::Connected;
            return Ok(());
        }
        e.state = QpState::Init;
        e.local = None;
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
        if let Some(e) = self.qps.remove(&qp) {
            self.note_receiver(&e.send_cq, &e.recv_cq, false);
        }
        self.ud_qps.remove(&qp);
        self.connecting.remove(&qp);
        self.forget_ud_resolutions(qp);
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
}
