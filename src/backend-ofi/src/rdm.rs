//! Connections of our own over reliable datagrams (FI_EP_RDM: shm,
//! tcp;ofi_rxm, efa, cxi, opx): docs/libfabric.md, Connections.
//!
//! An RDM address cannot be derived from DAT's IP address and `conn_qual` on
//! most fabrics, so the handshake goes over a TCP connection to the IA's
//! address and `conn_qual` (as rdma_cm uses IP to set up verbs connections).
//! The request carries a magic, the provider's name, the active endpoint's
//! fabric address (`fi_getname`) and our header with the private data; the
//! answer carries the passive endpoint's address, or a reject. Each side
//! inserts the other endpoint's address into the device's address vector,
//! and the active side's "ready" ends the handshake. The TCP connection stays
//! open for the DAT connection's life: a "close" on it is a disconnection,
//! its end without one a broken connection (the peer's process gone).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use daplrs_backend::{CmEvent, Error, Listener, Resource, Result};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::cm::{strip_header, with_header, PeerTable};
use crate::device::OfiDevice;
use crate::qp::OfiQp;

/// "DRSR", version 3: this backend's RDM handshake (version 1 sent receipts
/// on the handshake's connection, 2 wrote them on the fabric; 3 carries
/// each side's connection id, the tag of the messages it receives, since
/// connections share endpoints: `port`). A peer of another version is
/// rejected, not left waiting.
const MAGIC: [u8; 8] = [b'D', b'R', b'S', b'R', 0, 3, 0, 0];
/// What travels on the handshake's connection (one byte, then the fields).
const REQUEST: u8 = b'Q';
const ACCEPT: u8 = b'A';
const REJECT: u8 = b'R';
const READY: u8 = b'K';
const CLOSE: u8 = b'C';
/// The passive side's consumer accepted; its endpoint is being opened (as
/// an IB CM's MRA, it holds off the active side's timeout: opening an
/// ofi_rxm endpoint on verbs took 9 s in the soft-RoCE guest under load).
const ACCEPTING: u8 = b'W';
/// The largest frame we read (addresses and private data are far smaller).
const MAX_FRAME: usize = 64 << 10;
/// How long a connecting peer may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a TCP connect to the peer may take when DAT gave no timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a peer that said it accepts may take to say how to reach it.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections a listener reads requests from at once (a thread each); a new
/// one past it ends the oldest, so a peer that opens connections and sends
/// nothing holds neither threads nor descriptors without bound.
const READING_MAX: usize = 256;
/// Requests of a device waiting for the consumer's accept or reject; more
/// are rejected.
const WAITING_MAX: usize = 1024;

/// The address "no particular peer" (libfabric's FI_ADDR_UNSPEC).
pub(crate) const FI_ADDR_UNSPEC: u64 = u64::MAX;

/// One frame: its kind, then each field as a 32-bit length and its bytes.
fn write_frame(mut s: &TcpStream, kind: u8, fields: &[&[u8]]) -> io::Result<()> {
    let mut v = vec![kind, fields.len() as u8];
    for f in fields {
        v.extend_from_slice(&(f.len() as u32).to_le_bytes());
        v.extend_from_slice(f);
    }
    s.write_all(&v)
}

fn read_frame(mut s: &TcpStream) -> io::Result<(u8, Vec<Vec<u8>>)> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head)?;
    let mut fields = Vec::with_capacity(head[1] as usize);
    let mut total = 0;
    for _ in 0..head[1] {
        let mut len = [0u8; 4];
        s.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        total += len;
        if total > MAX_FRAME {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "frame too long"));
        }
        let mut f = vec![0u8; len];
        s.read_exact(&mut f)?;
        fields.push(f);
    }
    Ok((head[0], fields))
}

fn v4(a: io::Result<SocketAddr>) -> SocketAddrV4 {
    match a {
        Ok(SocketAddr::V4(a)) => a,
        _ => SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0),
    }
}

/// A connection request read, not yet accepted or rejected.
pub(crate) struct Pending {
    stream: TcpStream,
    /// The active endpoint's fabric address.
    name: Vec<u8>,
    /// The active side's connection id (the tag of what we send it).
    tag: u64,
    peer: PeerTable,
}

/// A connection id as the handshake carries it (8 bytes, little-endian).
fn tag_of(field: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(field.try_into().ok()?)).filter(|&t| t != 0)
}

/// The handshake's connection of a QP: its socket, and which connection of
/// the QP it belongs to (a QP reset and connected again has a new one).
pub(crate) struct Link {
    /// Open for the DAT connection's life (its close or end is the disconnection).
    pub stream: Arc<TcpStream>,
    pub generation: u64,
}

impl Link {
    /// Ends the connection: with a close (a disconnection) or without (broken).
    pub(crate) fn end(&self, graceful: bool) {
        if graceful {
            let _ = write_frame(&self.stream, CLOSE, &[]);
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }
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
        let port = v4(socket.local_addr()).port();
        let socket = Arc::new(socket);
        let closed = Arc::new(AtomicBool::new(false));
        let id = self.next_id();
        let (dev, s, c) = (self.me.clone(), socket.clone(), closed.clone());
        let thread = std::thread::Builder::new()
            .name("daplrs-ofi-psp".into())
            .spawn(move || accept_loop(&s, &dev, id, &c))
            .map_err(|_| Error::NoResource(Resource::Host))?;
        Ok(Arc::new(RdmListener {
            id,
            port,
            socket,
            closed,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Connects `qp` to the listener at `remote` (the handshake runs on a
    /// thread of its own; its outcome is a connection event).
    pub(crate) fn connect_rdm(
        &self,
        qp: Arc<OfiQp>,
        remote: SocketAddrV4,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<()> {
        let opening = std::time::Instant::now();
        qp.open_endpoint(self, &self.info, false)?;
        log::debug!(
            "QP {}: connecting, endpoint opened in {:?}",
            qp.num(),
            opening.elapsed()
        );
        qp.set_addresses(None, Some(remote));
        let name = qp.fabric_name().inspect_err(|_| qp.abandon())?;
        let header = with_header(self, Some(&qp), private_data);
        let tag = qp.tag().to_le_bytes();
        let provider = self.target().provider;
        let dev = self.me.clone();
        std::thread::Builder::new()
            .name("daplrs-ofi-conn".into())
            .spawn(move || {
                let fields: [&[u8]; 5] = [&MAGIC, provider.as_bytes(), &name, &header, &tag];
                connect_and_watch(&dev, &qp, remote, &fields, timeout);
            })
            .map_err(|_| Error::NoResource(Resource::Host))?;
        Ok(())
    }

    pub(crate) fn accept_rdm(&self, req: u64, qp: Arc<OfiQp>, private_data: &[u8]) -> Result<()> {
        let pending = self
            .tables
            .lock()
            .handshakes
            .remove(&req)
            .ok_or(Error::BadState)?;
        // A peer gone by now is seen below (its read fails).
        let _ = write_frame(&pending.stream, ACCEPTING, &[]);
        let opening = std::time::Instant::now();
        qp.open_endpoint(self, &self.info, true)?;
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
        qp.set_peer_table(pending.peer);
        qp.set_peer_tag(pending.tag);
        let name = qp.fabric_name()?;
        let header = with_header(self, Some(&qp), private_data);
        let tag = qp.tag().to_le_bytes();
        let generation = qp.attach_link(&pending.stream)?;
        // A peer gone by now is seen by the watcher (its read fails).
        let _ = write_frame(&pending.stream, ACCEPT, &[&name, &header, &tag]);
        let dev = self.me.clone();
        std::thread::Builder::new()
            .name("daplrs-ofi-conn".into())
            .spawn(move || {
                let ready = matches!(read_frame(&pending.stream), Ok((READY, _)));
                log::debug!("QP {}: peer ready: {ready}", qp.num());
                if ready && qp.is_link(generation) && qp.on_connected() {
                    if let Some(d) = dev.upgrade() {
                        d.emit(CmEvent::Established {
                            qp_num: qp.num(),
                            private_data: Vec::new(),
                        });
                    }
                }
                watch(&dev, &qp, &pending.stream, generation);
            })
            .map_err(|_| Error::NoResource(Resource::Host))?;
        Ok(())
    }

    pub(crate) fn reject_rdm(&self, req: u64, private_data: &[u8]) -> Result<()> {
        let pending = self
            .tables
            .lock()
            .handshakes
            .remove(&req)
            .ok_or(Error::BadState)?;
        let header = with_header(self, None, private_data);
        let _ = write_frame(&pending.stream, REJECT, &[&header]);
        let _ = pending.stream.shutdown(Shutdown::Write);
        Ok(())
    }
}

/// The connections a listener is reading requests from, oldest first (a
/// copy of each socket, to end it when it must make room).
type Reading = Arc<Mutex<std::collections::VecDeque<(u64, TcpStream)>>>;

/// Accepts handshake connections until the listener closes; each request is
/// read on a thread of its own (a slow peer holds up no other), at most
/// `READING_MAX` at once.
fn accept_loop(socket: &TcpListener, dev: &Weak<OfiDevice>, id: u64, closed: &AtomicBool) {
    let reading: Reading = Arc::default();
    let mut next = 0u64;
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
        let Ok(copy) = stream.try_clone() else {
            continue;
        };
        next += 1;
        {
            let mut r = reading.lock();
            if r.len() >= READING_MAX {
                if let Some((_, oldest)) = r.pop_front() {
                    let _ = oldest.shutdown(Shutdown::Both);
                }
            }
            r.push_back((next, copy));
        }
        let (dev, reading, me) = (dev.clone(), reading.clone(), next);
        let _ = std::thread::Builder::new()
            .name("daplrs-ofi-req".into())
            .spawn(move || {
                read_request(stream, &dev, id, || {
                    let mut r = reading.lock();
                    let before = r.len();
                    r.retain(|(n, _)| *n != me);
                    r.len() < before
                });
            });
    }
}

/// Reads a peer's request: one of ours for this provider becomes a
/// connection request; anything else is closed, the consumer never sees it.
/// `read` runs once the request is read (or failed): the connection no
/// longer counts among those being read; false if it was ended meanwhile to
/// make room (its request is then dropped, as if it had not come).
fn read_request(
    stream: TcpStream,
    dev: &Weak<OfiDevice>,
    listener: u64,
    read: impl FnOnce() -> bool,
) {
    let _ = stream.set_read_timeout(Some(REQUEST_TIMEOUT));
    let frame = read_frame(&stream);
    let kept = read();
    let (Ok((REQUEST, fields)), true) = (frame, kept) else {
        return;
    };
    let Some(dev) = dev.upgrade() else { return };
    let ours =
        fields.len() == 5 && fields[0] == MAGIC && fields[1] == dev.target().provider.as_bytes();
    let Some(tag) = fields.get(4).and_then(|f| tag_of(f)).filter(|_| ours) else {
        return;
    };
    let Some((peer, private_data)) = strip_header(&fields[3]) else {
        return;
    };
    let _ = stream.set_read_timeout(None);
    let (remote, local) = (v4(stream.peer_addr()), v4(stream.local_addr()));
    let req = dev.next_id();
    let name = fields[2].clone();
    {
        let mut tables = dev.tables.lock();
        if tables.handshakes.len() >= WAITING_MAX {
            drop(tables);
            let header = with_header(&dev, None, &[]);
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

/// The active side: connects, sends the request, and on an accept inserts the
/// peer, says ready and watches the connection.
fn connect_and_watch(
    dev: &Weak<OfiDevice>,
    qp: &Arc<OfiQp>,
    remote: SocketAddrV4,
    request: &[&[u8]],
    timeout: Option<Duration>,
) {
    let failed = |event: CmEvent| {
        // Not reported when this side disconnected meanwhile (it reported).
        if qp.end() {
            if let Some(d) = dev.upgrade() {
                d.emit(event);
            }
        }
    };
    let num = qp.num();
    let stream = match TcpStream::connect_timeout(
        &SocketAddr::V4(remote),
        timeout.unwrap_or(CONNECT_TIMEOUT),
    ) {
        Ok(s) => s,
        Err(e) => return failed(connect_failure(num, &e)),
    };
    let _ = stream.set_nodelay(true);
    let Ok(generation) = qp.attach_link(&stream) else {
        return;
    };
    qp.set_addresses(Some(v4(stream.local_addr())), None);
    let _ = stream.set_read_timeout(timeout);
    if write_frame(&stream, REQUEST, request).is_err() {
        return failed(CmEvent::rejected_not_by_peer(num));
    }
    let mut reply = read_frame(&stream);
    if matches!(reply, Ok((ACCEPTING, _))) {
        let _ = stream.set_read_timeout(Some(ACCEPT_TIMEOUT));
        reply = read_frame(&stream);
    }
    let _ = stream.set_read_timeout(None);
    log::debug!("QP {num}: answer read: {:?}", reply.as_ref().map(|r| r.0));
    if !qp.is_link(generation) {
        return;
    }
    match reply {
        Ok((ACCEPT, f)) if f.len() == 3 => {
            let (Some((peer, private_data)), Some(tag)) = (strip_header(&f[1]), tag_of(&f[2]))
            else {
                return failed(CmEvent::rejected_not_by_peer(num));
            };
            qp.set_peer_tag(tag);
            let Some(d) = dev.upgrade() else { return };
            if qp.insert_peer(&f[0]).is_err() {
                return failed(CmEvent::rejected_not_by_peer(num));
            }
            qp.set_peer_table(peer);
            log::debug!("QP {num}: peer inserted, ready");
            if write_frame(&stream, READY, &[]).is_ok() && qp.on_connected() {
                d.emit(CmEvent::Established {
                    qp_num: num,
                    private_data,
                });
            }
            drop(d);
            watch(dev, qp, &stream, generation);
        }
        Ok((REJECT, f)) if f.len() == 1 => match strip_header(&f[0]) {
            Some((_, private_data)) => failed(CmEvent::Rejected {
                qp_num: num,
                private_data,
                by_peer: true,
            }),
            None => failed(CmEvent::rejected_not_by_peer(num)),
        },
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            failed(CmEvent::TimedOut { qp_num: num })
        }
        _ => failed(CmEvent::rejected_not_by_peer(num)),
    }
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

/// Waits for the connection's end: a close is a disconnection, an end
/// without one (the peer's process gone) a broken connection. What the
/// provider completed before is read first; the rest is flushed.
fn watch(dev: &Weak<OfiDevice>, qp: &Arc<OfiQp>, stream: &TcpStream, generation: u64) {
    let graceful = loop {
        match read_frame(stream) {
            Ok((CLOSE, _)) => break true,
            Ok(_) => continue,
            Err(_) => break false,
        }
    };
    if !qp.is_link(generation) || qp.is_leaving() {
        // This side ended it (and reported), or the QP moved on.
        return;
    }
    let connecting = qp.was_connecting();
    qp.reap_completions();
    if !qp.end() {
        return;
    }
    let qp_num = qp.num();
    let event = match (connecting, graceful) {
        (true, _) => CmEvent::rejected_not_by_peer(qp_num),
        (false, true) => CmEvent::Disconnected { qp_num },
        (false, false) => CmEvent::Broken { qp_num },
    };
    if let Some(d) = dev.upgrade() {
        d.emit(event);
    }
}

/// Endpoints of this process that an address vector of this process still
/// names, kept open until it no longer does. libfabric 1.17's shm keeps, in an
/// AV entry for an endpoint of the same process, a pointer to that endpoint's
/// memory region (not a mapping of its own, as for another process's), reads
/// it when any later endpoint of the AV is enabled and writes through it when
/// the entry is removed (prov/util/src/util_shm.c: smr_map_to_endpoint,
/// smr_unmap_from_endpoint, smr_map_del). An endpoint closed first frees the
/// region under the entry, and the process crashes or corrupts memory (seen:
/// a SIGSEGV in fi_enable). Both sides of a DAT connection in one process is
/// what most DAT test programs do.
#[derive(Default)]
pub(crate) struct Keeper {
    /// A fabric address -> how many AV entries of this process name it.
    named: std::collections::HashMap<Vec<u8>, usize>,
    /// Endpoints (with their AV) closed by their QP while still named.
    parked: std::collections::HashMap<Vec<u8>, Parked>,
}

pub(crate) fn keeper() -> parking_lot::MutexGuard<'static, Keeper> {
    static KEEPER: std::sync::OnceLock<Mutex<Keeper>> = std::sync::OnceLock::new();
    KEEPER.get_or_init(Mutex::default).lock()
}

impl Keeper {
    pub(crate) fn named(&mut self, name: &[u8]) {
        *self.named.entry(name.to_vec()).or_insert(0) += 1;
    }

    /// An AV entry naming `name` was removed: a parked endpoint no longer
    /// named closes (after the keeper's lock is released: dropped by the caller).
    #[must_use]
    pub(crate) fn unnamed(&mut self, name: &[u8]) -> Option<Parked> {
        let count = self.named.get_mut(name)?;
        *count -= 1;
        if *count > 0 {
            return None;
        }
        self.named.remove(name);
        self.parked.remove(name)
    }

    /// Closes a QP's endpoint (`name`: its fabric address), or parks it while
    /// an AV entry of this process names it.
    pub(crate) fn close(&mut self, endpoint: Parked, name: &[u8]) {
        if name.is_empty() || !self.named.contains_key(name) {
            drop(endpoint);
            return;
        }
        self.parked.insert(name.to_vec(), endpoint);
    }
}

/// An endpoint, its AV and its bounce buffers, held only to be closed and
/// freed, in that order, when dropped; then the CQs it was bound to.
pub(crate) struct Parked {
    pub _ep: crate::Fid<fi::fid_ep>,
    pub _av: Option<crate::Fid<fi::fid_av>>,
    /// Where the endpoint's receives land (an SRQ of ours): freed after it closes.
    pub _bounces: crate::bounce::Bounces,
    pub _cqs: Vec<Arc<crate::cq::OfiCq>>,
}
