//! Connections of our own over reliable datagrams (FI_EP_RDM: shm,
//! tcp;ofi_rxm, efa, cxi, opx): docs/libfabric.md, Connections.
//!
//! An RDM address cannot be derived from DAT's IP address and `conn_qual` on
//! most fabrics, so the handshake goes over a TCP connection to the IA's
//! address and `conn_qual` (as rdma_cm uses IP to set up verbs connections).
//! The request carries a magic, the provider's name, the active endpoint's
//! fabric address (`fi_getname`), our header with the private data and the
//! active connection's id; the answer carries the passive endpoint's address
//! and connection id, or a reject. Each side inserts the other endpoint's
//! address into its port's address vector (`port`), and the active side's
//! "ready" ends the handshake. The TCP connection stays open for the DAT
//! connection's life: a "close" on it is a disconnection, its end without
//! one a broken connection (the peer's process gone).
//!
//! One thread per device (`Handshakes`) reads every handshake connection of
//! the device, sleeping in `epoll_wait`: requests coming in, answers to our
//! connects, the ends of connections made. A listener accepts on a thread
//! of its own (it hands each connection to that one). So a connection costs
//! a socket, not a thread (docs/libfabric.md, "Many connections over
//! reliable datagrams").

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use daplrs_backend::{CmEvent, Error, Listener, Resource, Result};

use parking_lot::Mutex;

use crate::cm::{strip_header, with_header};
use crate::device::OfiDevice;
use crate::keys::PeerTable;
use crate::qp::OfiQp;
use crate::wire::{
    frame, parse_frame, write_frame, ACCEPT, ACCEPTING, CLOSE, MAGIC, MAX_FRAME, READY, REJECT,
    REQUEST, UD_REQUEST,
};

mod ud;
pub(crate) use ud::UdPending;

/// How long a connecting peer may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a TCP connect to the peer may take when DAT gave no timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a peer that said it accepts may take to say how to reach it.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections a listener reads requests from at once; a new one past it
/// ends the oldest, so a peer that opens connections and sends nothing
/// holds no more than this many sockets.
const READING_MAX: usize = 256;
/// Requests of a device waiting for the consumer's accept or reject; more
/// are rejected.
const WAITING_MAX: usize = 1024;
/// The listening socket's backlog (connects the kernel completes before the
/// accepting thread takes them).
const LISTEN_BACKLOG: i32 = 4096;

fn v4(a: io::Result<SocketAddr>) -> SocketAddrV4 {
    match a {
        Ok(SocketAddr::V4(a)) => a,
        _ => SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0),
    }
}

/// A connection id as the handshake carries it (8 bytes, little-endian).
fn tag_of(field: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(field.try_into().ok()?)).filter(|&t| t != 0)
}

/// A connection request read, not yet accepted or rejected.
pub(crate) struct Pending {
    stream: Arc<TcpStream>,
    /// The active endpoint's fabric address.
    name: Vec<u8>,
    /// The active side's connection id (the tag of what we send it).
    tag: u64,
    peer: PeerTable,
}

pub(crate) struct RdmListener {
    id: u64,
    port: u16,
    socket: Arc<TcpListener>,
    closed: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Listener for RdmListener {
    fn id(&self) -> u64 {
        self.id
    }

    fn port(&self) -> u16 {
        self.port
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wakes the accepting thread (Linux fails a shut listener's accept);
        // joined, so that the port is free when close returns.
        // SAFETY: the listener's open socket.
        unsafe { libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR) };
        let thread = self.thread.lock().take();
        if let Some(t) = thread {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for RdmListener {
    fn drop(&mut self) {
        self.close();
    }
}

impl OfiDevice {
    /// A listener for RDM connections: a TCP socket on the IA's address and `port`.
    pub(crate) fn listen_rdm(&self, port: u16) -> Result<Arc<RdmListener>> {
        let at = SocketAddrV4::new(daplrs_backend::Device::address(self), port);
        let socket = TcpListener::bind(at).map_err(|e| match e.kind() {
            io::ErrorKind::AddrInUse => Error::AddrInUse,
            _ => Error::NoResource(Resource::Host),
        })?;
        // Room for a burst of connects (std listens with a backlog of 128: a
        // client connecting 1,024 EPs at once saw the rest of its SYNs
        // dropped, and each retried a second later). The kernel caps it at
        // net.core.somaxconn.
        // SAFETY: the listening socket just bound; listen again only resizes its backlog.
        unsafe { libc::listen(socket.as_raw_fd(), LISTEN_BACKLOG) };
        let port = v4(socket.local_addr()).port();
        let socket = Arc::new(socket);
        let closed = Arc::new(AtomicBool::new(false));
        let id = self.dom.next_id();
        let hs = self.handshakes()?;
        let (s, c) = (socket.clone(), closed.clone());
        let thread = std::thread::Builder::new()
            .name("daplrs-ofi-psp".into())
            .spawn(move || accept_loop(&s, &hs, id, &c))
            .map_err(|_| Error::NoResource(Resource::Host))?;
        Ok(Arc::new(RdmListener {
            id,
            port,
            socket,
            closed,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Connects `qp` to the listener at `remote`: the handshake runs on the
    /// device's handshake thread; its outcome is a connection event.
    pub(crate) fn connect_rdm(
        &self,
        qp: Arc<OfiQp>,
        remote: SocketAddrV4,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<()> {
        let hs = self.handshakes()?;
        let opening = Instant::now();
        qp.open_endpoint(&self.dom, &self.dom.info, false)?;
        log::debug!(
            "QP {}: connecting, endpoint opened in {:?}",
            qp.num(),
            opening.elapsed()
        );
        qp.set_addresses(None, Some(remote));
        let name = qp.fabric_name().inspect_err(|_| qp.abandon())?;
        let header = with_header(&self.dom, Some(&qp), private_data);
        let tag = qp.tag().to_le_bytes();
        let provider = self.target().provider;
        let request = frame(
            REQUEST,
            &[&MAGIC, provider.as_bytes(), &name, &header, &tag],
        );
        let connecting = match start_connect(remote) {
            Ok(s) => s,
            Err(e) => {
                // Said as the connection's outcome (by the handshake thread,
                // as a connect refused later is), not by this call.
                hs.defer(qp.clone(), connect_failure(qp.num(), &e));
                return Ok(());
            }
        };
        let deadline = opening + timeout.unwrap_or(CONNECT_TIMEOUT);
        let done = connect_done(&connecting);
        let mut conn = Conn {
            stream: Arc::new(connecting),
            buf: Vec::new(),
            qp: Some(qp.clone()),
            generation: 0,
            phase: Phase::Connecting {
                request,
                answer_timeout: timeout,
            },
            deadline: Some(deadline),
            watched: false,
        };
        if done {
            // Connected already: the request goes now, the thread reads the answer.
            match connected(&mut conn, false) {
                Ok(Next::Keep) => {}
                Ok(Next::Drop) => return Ok(()),
                Err(event) => {
                    hs.defer(qp, event);
                    return Ok(());
                }
            }
        }
        hs.add(conn);
        Ok(())
    }

    pub(crate) fn accept_rdm(&self, req: u64, qp: Arc<OfiQp>, private_data: &[u8]) -> Result<()> {
        let hs = self.handshakes()?;
        let pending = self
            .tables
            .lock()
            .handshakes
            .remove(&req)
            .ok_or(Error::BadState)?;
        // A peer gone by now is seen below (its read fails).
        let _ = write_frame(&pending.stream, ACCEPTING, &[]);
        let opening = Instant::now();
        qp.open_endpoint(&self.dom, &self.dom.info, true)?;
        log::debug!(
            "QP {}: accepting, endpoint opened in {:?}",
            qp.num(),
            opening.elapsed()
        );
        qp.set_addresses(
            Some(v4(pending.stream.local_addr())),
            Some(v4(pending.stream.peer_addr())),
        );
        qp.insert_peer(&pending.name)?;
        let name = qp.fabric_name()?;
        let keys = self.dom.peer_keys.get(pending.peer.share);
        self.dom
            .left_locks
            .watch(&name, &pending.name, keys.as_ref());
        qp.set_peer_table(pending.peer, keys);
        qp.set_peer_tag(pending.tag);
        let header = with_header(&self.dom, Some(&qp), private_data);
        let tag = qp.tag().to_le_bytes();
        let generation = qp.attach_link(&pending.stream)?;
        // A peer gone by now is seen by the handshake thread (its read fails).
        let _ = write_frame(&pending.stream, ACCEPT, &[&name, &header, &tag]);
        hs.add(Conn {
            stream: pending.stream,
            buf: Vec::new(),
            qp: Some(qp),
            generation,
            phase: Phase::AwaitingReady,
            deadline: None,
            watched: false,
        });
        Ok(())
    }

    pub(crate) fn reject_rdm(&self, req: u64, private_data: &[u8]) -> Result<()> {
        if self.reject_ud(req, private_data) {
            return Ok(());
        }
        let pending = self
            .tables
            .lock()
            .handshakes
            .remove(&req)
            .ok_or(Error::BadState)?;
        let header = with_header(&self.dom, None, private_data);
        let _ = write_frame(&pending.stream, REJECT, &[&header]);
        let _ = pending.stream.shutdown(Shutdown::Write);
        Ok(())
    }

    /// The device's handshake thread, started at its first use.
    fn handshakes(&self) -> Result<Arc<Handshakes>> {
        let mut hs = self.handshakes.lock();
        if let Some(h) = hs.as_ref() {
            return Ok(h.clone());
        }
        let h = Handshakes::start(self.me.clone()).map_err(|e| {
            log::warn!("handshake thread: {e}");
            Error::NoResource(Resource::Host)
        })?;
        *hs = Some(h.clone());
        Ok(h)
    }
}

/// A TCP connect to `remote` begun, not waited for (the handshake thread
/// learns its outcome when the socket turns writable).
fn start_connect(remote: SocketAddrV4) -> io::Result<TcpStream> {
    // SAFETY: plain system calls on a socket of ours, owned once created.
    unsafe {
        let fd = libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: remote.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*remote.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let rc = libc::connect(
            fd,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(e);
            }
        }
        Ok(stream)
    }
}

/// Accepts handshake connections until the listener closes, handing each to
/// the handshake thread, which reads its request.
fn accept_loop(socket: &TcpListener, hs: &Arc<Handshakes>, id: u64, closed: &AtomicBool) {
    loop {
        let stream = socket.accept();
        if closed.load(Ordering::Acquire) {
            return;
        }
        let Ok((stream, _)) = stream else {
            // Out of descriptors, say: the peer's connect fails, we go on.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let mut conn = Conn {
            stream: Arc::new(stream),
            buf: Vec::new(),
            qp: None,
            generation: 0,
            phase: Phase::Request { listener: id },
            deadline: Some(Instant::now() + REQUEST_TIMEOUT),
            watched: false,
        };
        // The request most often came with the connection: read here, it
        // costs the handshake thread no turn.
        let ended = read_available(&mut conn);
        if ended || matches!(parse_frame(&conn.buf), Ok(Some(_)) | Err(_)) {
            if let Some(dev) = hs.dev.upgrade() {
                read_frames(&dev, None, &mut conn, ended);
            }
            continue;
        }
        hs.add(conn);
    }
}

/// Where a handshake connection is.
enum Phase {
    /// Passive: reading the peer's request (for listener `listener`).
    Request { listener: u64 },
    /// Active: the TCP connect is under way; then the request goes.
    Connecting {
        request: Vec<u8>,
        answer_timeout: Option<Duration>,
    },
    /// Active: waiting for the answer.
    AwaitingAnswer,
    /// Passive: accepted, waiting for the peer's "ready".
    AwaitingReady,
    /// Connected: waiting for a close or the end.
    Linked,
    /// A datagram resolution's TCP connect is under way (`ud`); `until`:
    /// its deadline, if DAT gave one.
    UdConnecting {
        request: Vec<u8>,
        until: Option<Instant>,
        id: u64,
        qp: u32,
    },
    /// A datagram resolution waits for the answer.
    UdAwaitingAnswer { id: u64, qp: u32 },
}

/// A handshake connection the handshake thread reads.
struct Conn {
    stream: Arc<TcpStream>,
    /// What was read and not yet parsed.
    buf: Vec<u8>,
    qp: Option<Arc<OfiQp>>,
    generation: u64,
    phase: Phase,
    deadline: Option<Instant>,
    /// Its socket is in the thread's epoll set (`Handshakes::forget`).
    watched: bool,
}

/// What reading a connection came to.
enum Next {
    /// Keep reading it (with this deadline).
    Keep,
    /// Forget it (its socket closes unless a QP's link holds it).
    Drop,
}

#[derive(Default)]
struct Table {
    next: u64,
    conns: HashMap<u64, Conn>,
    /// (deadline, token) of the connections that have one.
    deadlines: BTreeSet<(Instant, u64)>,
    /// The requests being read per listener, oldest first (READING_MAX).
    reading: HashMap<u64, VecDeque<u64>>,
    /// Connects that failed before a socket was read: their events, said
    /// by the thread.
    deferred: Vec<(Arc<OfiQp>, CmEvent)>,
    /// Events of no QP's connection to say (datagram resolutions: `ud`).
    emits: Vec<CmEvent>,
}

/// The device's handshake thread and what it reads.
pub(crate) struct Handshakes {
    dev: Weak<OfiDevice>,
    epoll: OwnedFd,
    wake: OwnedFd,
    stop: AtomicBool,
    table: Mutex<Table>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Handshakes {
    fn start(dev: Weak<OfiDevice>) -> io::Result<Arc<Handshakes>> {
        // SAFETY: plain system calls; each descriptor is owned once created.
        let (epoll, wake) = unsafe {
            let epoll = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            if epoll < 0 {
                return Err(io::Error::last_os_error());
            }
            let epoll = OwnedFd::from_raw_fd(epoll);
            let wake = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
            if wake < 0 {
                return Err(io::Error::last_os_error());
            }
            (epoll, OwnedFd::from_raw_fd(wake))
        };
        let hs = Arc::new(Handshakes {
            dev,
            epoll,
            wake,
            stop: AtomicBool::new(false),
            table: Mutex::new(Table::default()),
            thread: Mutex::new(None),
        });
        hs.ctl(
            libc::EPOLL_CTL_ADD,
            hs.wake.as_raw_fd(),
            libc::EPOLLIN as u32,
            0,
        )?;
        let me = Arc::downgrade(&hs);
        let thread = std::thread::Builder::new()
            .name("daplrs-ofi-cm".into())
            .spawn(move || run(me))?;
        *hs.thread.lock() = Some(thread);
        Ok(hs)
    }

    fn ctl(&self, op: i32, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: our epoll descriptor; `fd` open (owned by a connection of ours).
        let rc = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Has the thread report `event` of `qp`'s connect (unless the QP ended).
    fn defer(&self, qp: Arc<OfiQp>, event: CmEvent) {
        self.table.lock().deferred.push((qp, event));
        self.poke();
    }

    /// Starts reading `conn` (for a connect under way: waiting for it).
    fn add(&self, mut conn: Conn) {
        let mut t = self.table.lock();
        t.next += 1;
        let token = t.next;
        let events = match conn.phase {
            Phase::Connecting { .. } | Phase::UdConnecting { .. } => libc::EPOLLOUT as u32,
            _ => (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        } | libc::EPOLLONESHOT as u32;
        if let Phase::Request { listener } = conn.phase {
            let reading = t.reading.entry(listener).or_default();
            reading.push_back(token);
            if reading.len() > READING_MAX {
                // The oldest request being read makes room (see READING_MAX).
                if let Some(oldest) = reading.pop_front() {
                    if let Some(mut c) = t.conns.remove(&oldest) {
                        if let Some(d) = c.deadline {
                            t.deadlines.remove(&(d, oldest));
                        }
                        self.forget(&mut c);
                        let _ = c.stream.shutdown(Shutdown::Both);
                    }
                }
            }
        }
        // The thread sleeps until its first deadline: woken only if this one
        // comes sooner (a new socket in the set wakes it by itself).
        let sooner = conn
            .deadline
            .is_some_and(|d| t.deadlines.first().is_none_or(|&(first, _)| d < first));
        if let Some(d) = conn.deadline {
            t.deadlines.insert((d, token));
        }
        let fd = conn.stream.as_raw_fd();
        conn.watched = true;
        t.conns.insert(token, conn);
        if let Err(e) = self.ctl(libc::EPOLL_CTL_ADD, fd, events, token) {
            log::warn!("handshake: epoll_ctl: {e}");
            if let Some(c) = t.conns.remove(&token) {
                if let Some(d) = c.deadline {
                    t.deadlines.remove(&(d, token));
                }
                if let Some(qp) = c.qp.clone() {
                    let event = CmEvent::rejected_not_by_peer(qp.num());
                    t.deferred.push((qp, event));
                }
            }
        }
        let deferred = !t.deferred.is_empty() || !t.emits.is_empty();
        drop(t);
        if sooner || deferred {
            self.poke();
        }
    }

    /// No longer watches `conn`'s socket (a QP's link may keep a copy of
    /// its descriptor open, which would keep the registration). Once only: a
    /// request's socket is forgotten before the consumer learns of it, whose
    /// accept hands the same socket back (`add`).
    fn forget(&self, conn: &mut Conn) {
        if std::mem::take(&mut conn.watched) {
            let _ = self.ctl(libc::EPOLL_CTL_DEL, conn.stream.as_raw_fd(), 0, 0);
        }
    }

    fn poke(&self) {
        let one = 1u64;
        // SAFETY: eight bytes to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Stops the thread; the connections it read are dropped (their QPs
    /// were destroyed by the device's close).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.poke();
        let thread = self.thread.lock().take();
        if let Some(t) = thread {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        let (conns, deferred) = {
            let mut t = self.table.lock();
            (
                std::mem::take(&mut t.conns),
                std::mem::take(&mut t.deferred),
            )
        };
        let mut conns = conns;
        for c in conns.values_mut() {
            self.forget(c);
        }
        drop((conns, deferred));
    }

    /// Takes connection `token` out of the table to handle it.
    fn take(&self, token: u64) -> Option<Conn> {
        let mut t = self.table.lock();
        let conn = t.conns.remove(&token)?;
        if let Some(d) = conn.deadline {
            t.deadlines.remove(&(d, token));
        }
        if let Phase::Request { listener } = conn.phase {
            if let Some(r) = t.reading.get_mut(&listener) {
                r.retain(|&x| x != token);
            }
        }
        Some(conn)
    }

    /// Puts connection `token` back, to read on (one-shot: armed again).
    fn keep(&self, token: u64, conn: Conn) {
        let events = match conn.phase {
            Phase::Connecting { .. } | Phase::UdConnecting { .. } => libc::EPOLLOUT as u32,
            _ => (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        } | libc::EPOLLONESHOT as u32;
        let fd = conn.stream.as_raw_fd();
        let mut t = self.table.lock();
        if let Some(d) = conn.deadline {
            t.deadlines.insert((d, token));
        }
        if let Phase::Request { listener } = conn.phase {
            t.reading.entry(listener).or_default().push_back(token);
        }
        t.conns.insert(token, conn);
        if let Err(e) = self.ctl(libc::EPOLL_CTL_MOD, fd, events, token) {
            log::warn!("handshake: epoll_ctl: {e}");
            if let Some(mut c) = t.conns.remove(&token) {
                self.forget(&mut c);
            }
        }
    }

    /// How long the thread may sleep: until the first deadline.
    fn sleep_ms(&self) -> i32 {
        let t = self.table.lock();
        match t.deadlines.first() {
            None => -1,
            Some((d, _)) => {
                let left = d.saturating_duration_since(Instant::now());
                left.as_millis().min(i32::MAX as u128) as i32 + 1
            }
        }
    }

    /// The connections whose deadline passed.
    fn expired(&self) -> Vec<(u64, Conn)> {
        let now = Instant::now();
        let mut due = Vec::new();
        {
            let t = self.table.lock();
            due.extend(
                t.deadlines
                    .iter()
                    .take_while(|(d, _)| *d <= now)
                    .map(|&(_, tok)| tok),
            );
        }
        due.into_iter()
            .filter_map(|tok| self.take(tok).map(|c| (tok, c)))
            .collect()
    }
}

/// The handshake thread: reads what is ready, handles what timed out.
fn run(me: Weak<Handshakes>) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        let Some(hs) = me.upgrade() else { return };
        if hs.stop.load(Ordering::Acquire) {
            return;
        }
        let timeout = hs.sleep_ms();
        let epoll = hs.epoll.as_raw_fd();
        drop(hs);
        // SAFETY: our epoll descriptor (the Handshakes outlive the thread:
        // `stop` joins it); room for 64 events.
        let n = unsafe { libc::epoll_wait(epoll, events.as_mut_ptr(), 64, timeout) };
        let Some(hs) = me.upgrade() else { return };
        if hs.stop.load(Ordering::Acquire) {
            return;
        }
        let Some(dev) = hs.dev.upgrade() else { return };
        for e in events.iter().take(n.max(0) as usize) {
            if e.u64 == 0 {
                let mut v = 0u64;
                // SAFETY: reading our eventfd's counter resets it.
                unsafe { libc::read(hs.wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
                continue;
            }
            let Some(mut conn) = hs.take(e.u64) else {
                continue;
            };
            match handle(&dev, &hs, &mut conn, false) {
                Next::Keep => hs.keep(e.u64, conn),
                Next::Drop => hs.forget(&mut conn),
            }
        }
        for (token, mut conn) in hs.expired() {
            match handle(&dev, &hs, &mut conn, true) {
                Next::Keep => hs.keep(token, conn),
                Next::Drop => hs.forget(&mut conn),
            }
        }
        let deferred = std::mem::take(&mut hs.table.lock().deferred);
        for (qp, event) in deferred {
            failed(&dev, &qp, event);
        }
        let emits = std::mem::take(&mut hs.table.lock().emits);
        for event in emits {
            dev.emit(event);
        }
    }
}

/// Reads what `conn` has (or, `expired`, handles its deadline).
fn handle(dev: &Arc<OfiDevice>, hs: &Handshakes, conn: &mut Conn, expired: bool) -> Next {
    if let Phase::UdConnecting { .. } = conn.phase {
        return ud::connected(dev, conn, expired);
    }
    if let Phase::Connecting { .. } = conn.phase {
        return match connected(conn, expired) {
            Ok(next) => next,
            Err(event) => {
                if let Some(qp) = &conn.qp {
                    failed(dev, qp, event);
                }
                Next::Drop
            }
        };
    }
    if expired {
        return timed_out(dev, conn);
    }
    let ended = read_available(conn);
    read_frames(dev, Some(hs), conn, ended)
}

/// Reads everything `conn`'s socket has, without waiting; returns whether
/// the connection ended (or sent more than a frame's worth where none is
/// awaited beyond one).
fn read_available(conn: &mut Conn) -> bool {
    let ended;
    let mut chunk = [0u8; 4096];
    loop {
        // SAFETY: a socket of ours; `chunk` has room for its length.
        let n = unsafe {
            libc::recv(
                conn.stream.as_raw_fd(),
                chunk.as_mut_ptr().cast(),
                chunk.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => {
                ended = true;
                break;
            }
            n if n > 0 => {
                conn.buf.extend_from_slice(&chunk[..n as usize]);
                if conn.buf.len() > MAX_FRAME + 64 && !matches!(conn.phase, Phase::Linked) {
                    ended = true;
                    break;
                }
            }
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                ended = e.kind() != io::ErrorKind::WouldBlock;
                break;
            }
        }
    }
    ended
}

/// Handles the frames read on `conn` (`hs`: the thread's, where it reads
/// it), then its end if it `ended`.
fn read_frames(
    dev: &Arc<OfiDevice>,
    hs: Option<&Handshakes>,
    conn: &mut Conn,
    ended: bool,
) -> Next {
    let mut ended = ended;
    loop {
        let parsed = match parse_frame(&conn.buf) {
            Ok(p) => p,
            Err(_) => {
                ended = true;
                None
            }
        };
        let Some((kind, fields, used)) = parsed else {
            break;
        };
        conn.buf.drain(..used);
        if let Next::Drop = on_frame(dev, hs, conn, kind, fields) {
            return Next::Drop;
        }
    }
    if matches!(conn.phase, Phase::Linked) {
        // Nothing but a close comes on a connection made: keep no bytes.
        conn.buf.clear();
    }
    if ended {
        return on_end(dev, conn, false);
    }
    Next::Keep
}

/// A frame read on `conn`.
fn on_frame(
    dev: &Arc<OfiDevice>,
    hs: Option<&Handshakes>,
    conn: &mut Conn,
    kind: u8,
    fields: Vec<Vec<u8>>,
) -> Next {
    match conn.phase {
        Phase::Request { listener } => {
            // Out of the epoll set before the consumer may accept, whose
            // accept adds the same socket again.
            if let Some(hs) = hs {
                hs.forget(conn);
            }
            if kind == REQUEST {
                request(dev, conn, listener, fields);
            } else if kind == UD_REQUEST {
                ud::request(dev, conn, listener, fields);
            }
            // Read or not ours: either way not read any more here (a
            // request waits for the consumer in the device's table).
            Next::Drop
        }
        Phase::AwaitingAnswer => answer(dev, conn, kind, fields),
        Phase::AwaitingReady => {
            if kind == READY {
                let qp = conn.qp.as_ref().expect("a passive connection's QP");
                log::debug!("QP {}: peer ready", qp.num());
                if qp.is_link(conn.generation) && qp.on_connected() {
                    dev.emit(CmEvent::Established {
                        qp_num: qp.num(),
                        private_data: Vec::new(),
                    });
                }
                conn.phase = Phase::Linked;
            }
            Next::Keep
        }
        Phase::Linked => {
            if kind == CLOSE {
                return on_end(dev, conn, true);
            }
            Next::Keep
        }
        Phase::Connecting { .. } | Phase::UdConnecting { .. } => Next::Keep,
        Phase::UdAwaitingAnswer { .. } => ud::answer(dev, conn, kind, fields),
    }
}

/// A peer's request read: one of ours for this provider becomes a
/// connection request; anything else is closed, the consumer never sees it.
fn request(dev: &Arc<OfiDevice>, conn: &mut Conn, listener: u64, fields: Vec<Vec<u8>>) {
    let ours =
        fields.len() == 5 && fields[0] == MAGIC && fields[1] == dev.target().provider.as_bytes();
    let Some(tag) = fields.get(4).and_then(|f| tag_of(f)).filter(|_| ours) else {
        return;
    };
    let Some((peer, private_data)) = strip_header(&fields[3]) else {
        return;
    };
    // The stream goes to the consumer's accept or reject (this thread no
    // longer reads it).
    let stream = conn.stream.clone();
    let (remote, local) = (v4(stream.peer_addr()), v4(stream.local_addr()));
    let req = dev.dom.next_id();
    let name = fields[2].clone();
    {
        let mut tables = dev.tables.lock();
        if tables.handshakes.len() >= WAITING_MAX {
            drop(tables);
            let header = with_header(&dev.dom, None, &[]);
            let _ = write_frame(&stream, REJECT, &[&header]);
            return;
        }
        tables.handshakes.insert(
            req,
            Pending {
                stream,
                name,
                tag,
                peer,
            },
        );
    }
    dev.emit(CmEvent::ConnectRequest {
        listener,
        req,
        private_data,
        remote,
        local,
    });
}

/// The active side's TCP connect finished (or timed out): the request goes,
/// and the answer is awaited. Err: the connect failed, with the event that
/// says so (for the caller to report).
fn connected(conn: &mut Conn, expired: bool) -> std::result::Result<Next, CmEvent> {
    let Phase::Connecting {
        request,
        answer_timeout,
    } = std::mem::replace(&mut conn.phase, Phase::AwaitingAnswer)
    else {
        return Ok(Next::Keep);
    };
    let qp = conn.qp.clone().expect("an active connection's QP");
    let num = qp.num();
    let outcome = if expired {
        Err(io::Error::from_raw_os_error(libc::ETIMEDOUT))
    } else {
        socket_error(&conn.stream)
    };
    if let Err(e) = outcome {
        return Err(connect_failure(num, &e));
    }
    // Connected: the socket blocks again for writes (`write_frame`).
    let _ = conn.stream.set_nonblocking(false);
    let _ = conn.stream.set_nodelay(true);
    let Ok(generation) = qp.attach_link(&conn.stream) else {
        return Ok(Next::Drop);
    };
    conn.generation = generation;
    qp.set_addresses(Some(v4(conn.stream.local_addr())), None);
    if (&*conn.stream).write_all(&request).is_err() {
        return Err(CmEvent::rejected_not_by_peer(num));
    }
    conn.deadline = answer_timeout.map(|t| Instant::now() + t);
    Ok(Next::Keep)
}

/// Whether a connect begun non-blocking is done already (over loopback it
/// most often is by the time `connect` returns).
fn connect_done(s: &TcpStream) -> bool {
    let mut pfd = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one pollfd of ours, no waiting.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n == 1 && pfd.revents & libc::POLLOUT != 0
}

/// The pending error of a socket whose connect finished.
fn socket_error(s: &TcpStream) -> io::Result<()> {
    match s.take_error() {
        Ok(None) => Ok(()),
        Ok(Some(e)) | Err(e) => Err(e),
    }
}

/// The answer to our request.
fn answer(dev: &Arc<OfiDevice>, conn: &mut Conn, kind: u8, f: Vec<Vec<u8>>) -> Next {
    let qp = conn.qp.clone().expect("an active connection's QP");
    let num = qp.num();
    log::debug!("QP {num}: answer read: {kind}");
    if !qp.is_link(conn.generation) {
        return Next::Drop;
    }
    match kind {
        ACCEPTING => {
            conn.deadline = Some(Instant::now() + ACCEPT_TIMEOUT);
            Next::Keep
        }
        ACCEPT if f.len() == 3 => {
            let (Some((peer, private_data)), Some(tag)) = (strip_header(&f[1]), tag_of(&f[2]))
            else {
                failed(dev, &qp, CmEvent::rejected_not_by_peer(num));
                return Next::Drop;
            };
            qp.set_peer_tag(tag);
            if qp.insert_peer(&f[0]).is_err() {
                failed(dev, &qp, CmEvent::rejected_not_by_peer(num));
                return Next::Drop;
            }
            let keys = dev.dom.peer_keys.get(peer.share);
            if let Ok(own) = qp.fabric_name() {
                dev.dom.left_locks.watch(&own, &f[0], keys.as_ref());
            }
            qp.set_peer_table(peer, keys);
            log::debug!("QP {num}: peer inserted, ready");
            conn.deadline = None;
            conn.phase = Phase::Linked;
            if write_frame(&conn.stream, READY, &[]).is_ok() && qp.on_connected() {
                dev.emit(CmEvent::Established {
                    qp_num: num,
                    private_data,
                });
            }
            Next::Keep
        }
        REJECT if f.len() == 1 => {
            match strip_header(&f[0]) {
                Some((_, private_data)) => failed(
                    dev,
                    &qp,
                    CmEvent::Rejected {
                        qp_num: num,
                        private_data,
                        by_peer: true,
                    },
                ),
                None => failed(dev, &qp, CmEvent::rejected_not_by_peer(num)),
            }
            Next::Drop
        }
        _ => {
            failed(dev, &qp, CmEvent::rejected_not_by_peer(num));
            Next::Drop
        }
    }
}

/// A deadline passed: a request never read, or an answer never came.
fn timed_out(dev: &Arc<OfiDevice>, conn: &mut Conn) -> Next {
    if let Phase::UdAwaitingAnswer { .. } = conn.phase {
        return ud::unanswered(dev, conn);
    }
    if let (Phase::AwaitingAnswer, Some(qp)) = (&conn.phase, &conn.qp) {
        if qp.is_link(conn.generation) {
            failed(dev, qp, CmEvent::TimedOut { qp_num: qp.num() });
        }
    }
    Next::Drop
}

/// A connect that failed: reported unless this side disconnected meanwhile
/// (it reported then).
fn failed(dev: &Arc<OfiDevice>, qp: &Arc<OfiQp>, event: CmEvent) {
    if qp.end() {
        dev.emit(event);
    }
}

/// The connection's end: a close is a disconnection, an end without one
/// (the peer's process gone) a broken connection. What the provider
/// completed before is read first; the rest is flushed.
fn on_end(dev: &Arc<OfiDevice>, conn: &mut Conn, graceful: bool) -> Next {
    if let Phase::UdAwaitingAnswer { .. } = conn.phase {
        return ud::unanswered(dev, conn);
    }
    let Some(qp) = conn.qp.clone() else {
        return Next::Drop;
    };
    if let Phase::AwaitingAnswer = conn.phase {
        if qp.is_link(conn.generation) {
            failed(dev, &qp, CmEvent::rejected_not_by_peer(qp.num()));
        }
        return Next::Drop;
    }
    if !qp.is_link(conn.generation) || qp.is_leaving() {
        // This side ended it (and reported), or the QP moved on.
        return Next::Drop;
    }
    let connecting = qp.was_connecting();
    qp.reap_completions();
    if !qp.end() {
        return Next::Drop;
    }
    let qp_num = qp.num();
    let event = match (connecting, graceful) {
        (true, _) => CmEvent::rejected_not_by_peer(qp_num),
        (false, true) => CmEvent::Disconnected { qp_num },
        (false, false) => CmEvent::Broken { qp_num },
    };
    dev.emit(event);
    Next::Drop
}

/// What a failed TCP connect to the peer's listener means for DAT.
fn connect_failure(qp_num: u32, e: &io::Error) -> CmEvent {
    match e.raw_os_error() {
        Some(libc::EHOSTUNREACH | libc::ENETUNREACH) => CmEvent::Unreachable { qp_num },
        Some(libc::ETIMEDOUT) => CmEvent::TimedOut { qp_num },
        _ if e.kind() == io::ErrorKind::TimedOut => CmEvent::TimedOut { qp_num },
        // Nobody listening on that conn_qual.
        _ => CmEvent::rejected_not_by_peer(qp_num),
    }
}
