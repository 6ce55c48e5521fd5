//! Connection management through rdma_cm, with QPs we create and move ourselves.
//!
//! Active side: resolve address, resolve route, rdma_connect with our QP number; on
//! CONNECT_RESPONSE the QP goes to RTR/RTS and rdma_establish completes the handshake.
//! Passive side: a CONNECT_REQUEST becomes a connection request the core accepts (QP to
//! RTR/RTS, rdma_accept; ESTABLISHED follows) or rejects. The consumer's private data travels
//! unchanged (rdma_cm pads it; IB gives no length).
//!
//! Each CM id's context is a token; `CmState::owners` says whether it is a listener, a request
//! not yet accepted, or a QP's connection. A QP's id is used and destroyed only under the QP's
//! `conn` lock, so the event thread and application threads never race on it.
//!
//! Datagram address resolution is rdma_cm's UDP port space (SIDR): every listener also listens
//! there on its port (same token); `ud_resolve` resolves address and route and connects with
//! the datagram QP's number, and the ESTABLISHED event's `ud` parameters (path, remote QP
//! number, Q_Key) become an address handle; a request there is accepted with the accepting
//! QP's number. rdma_cm tells the passive side nothing of the requester but its private data
//! (padded to SIDR's fixed size), so our requests carry a header before the consumer's data:
//! the requester's QP number, LID and GID, from which the passive side makes its address
//! handle, and the data's length (`ud_request_data`); answers carry the length too. A
//! resolution's id lives only until its answer.

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::*;

use super::ah::VerbsAh;
use super::cm_state::{Owner, Request, UdRequester, UdResolution};
use super::qp::{Phase, VerbsQp};
use super::shared::Shared;
use super::sys::{self, Ptr};
use daplrs_backend::{CmEvent, ConnRequestId, Listener, UdPeer};
use daplrs_backend::{Error, Resource, Result};

/// rdma_cm's address and route resolution timeout.
const RESOLVE_MS: i32 = 2000;
/// IB CM reject reason "consumer defined": the peer's application said no.
const REJ_CONSUMER_DEFINED: i32 = 28;
/// SIDR REP status "rejected" (rdma_reject of a UDP port space request); a datagram
/// resolution's UNREACHABLE event carries it when the remote consumer said no.
const SIDR_REJECT: i32 = 2;

/// What a UDP port space answer (ESTABLISHED) says of the remote datagram QP.
#[derive(Clone, Copy)]
struct UdRemote {
    ah_attr: ibv_ah_attr,
    qp_num: u32,
    qkey: u32,
}

/// The header of our datagram resolution messages: magic, version, the length of the
/// consumer's private data after it; a request's also the requester's QP number, LID (IB) and
/// GID (big-endian).
const UD_MAGIC: [u8; 2] = *b"DU";
const UD_VERSION: u8 = 1;
const UD_ANSWER_HEADER: usize = 4;
const UD_REQUEST_HEADER: usize = 28;

fn ud_answer_data(private_data: &[u8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(UD_ANSWER_HEADER + private_data.len());
    d.extend_from_slice(&UD_MAGIC);
    d.push(UD_VERSION);
    d.push(private_data.len() as u8);
    d.extend_from_slice(private_data);
    d
}

fn ud_request_data(who: &UdRequester, private_data: &[u8]) -> Vec<u8> {
    let mut d = ud_answer_data(&[]);
    d[3] = private_data.len() as u8;
    d.extend_from_slice(&who.qpn.to_be_bytes());
    d.extend_from_slice(&who.lid.to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(&who.gid);
    d.extend_from_slice(private_data);
    d
}

/// The consumer's private data of an answer (what came, if it has no header of ours).
fn ud_answer_private_data(d: &[u8]) -> Vec<u8> {
    match d {
        [m0, m1, UD_VERSION, len, rest @ ..]
            if [*m0, *m1] == UD_MAGIC && rest.len() >= usize::from(*len) =>
        {
            rest[..usize::from(*len)].to_vec()
        }
        _ => d.to_vec(),
    }
}

/// The requester and the consumer's private data of a request; None for one that is not ours.
fn ud_parse_request(d: &[u8]) -> Option<(UdRequester, Vec<u8>)> {
    if d.len() < UD_REQUEST_HEADER || d[..2] != UD_MAGIC || d[2] != UD_VERSION {
        return None;
    }
    let len = usize::from(d[3]);
    let pd = d.get(UD_REQUEST_HEADER..UD_REQUEST_HEADER + len)?.to_vec();
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&d[12..28]);
    Some((
        UdRequester {
            qpn: u32::from_be_bytes([d[4], d[5], d[6], d[7]]),
            lid: u16::from_be_bytes([d[8], d[9]]),
            gid,
        },
        pd,
    ))
}

/// This port's GID for datagram paths and its index: the RoCE v2 entry of the IA's IPv4
/// address (what rdma_cm resolves IPv4 paths to), else the port's first GID (InfiniBand);
/// and the port's LID.
fn ud_local_address(s: &Shared) -> Option<(u8, [u8; 16], u16)> {
    // SAFETY: plain data; ___ibv_query_port is the C behaviour of ibv_query_port.
    let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: our context.
    if unsafe { ___ibv_query_port(s.ctx.0, s.port, &mut pa) } != 0 {
        return None;
    }
    // SAFETY: our context's device.
    let dev = sys::cstr(unsafe { ibv_get_device_name((*s.ctx.0).device) });
    let mapped = s.addr.to_ipv6_mapped().octets();
    let mut first: Option<(u8, [u8; 16])> = None;
    let mut mapped_any: Option<(u8, [u8; 16])> = None;
    for i in 0..pa.gid_tbl_len.clamp(0, 256) {
        // SAFETY: plain data.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: our context; an index within the port's table.
        if unsafe { ibv_query_gid(s.ctx.0, s.port, i, &mut gid) } != 0 {
            continue;
        }
        // SAFETY: every view of a GID is its 16 bytes.
        let raw = unsafe { gid.raw };
        if raw == [0u8; 16] {
            continue;
        }
        let entry = (i as u8, raw);
        first.get_or_insert(entry);
        if raw == mapped {
            let kind = std::fs::read_to_string(format!(
                "/sys/class/infiniband/{dev}/ports/{}/gid_attrs/types/{i}",
                s.port
            ))
            .unwrap_or_default();
            if kind.contains("v2") {
                return Some((entry.0, entry.1, pa.lid));
            }
            mapped_any.get_or_insert(entry);
        }
    }
    mapped_any.or(first).map(|(i, g)| (i, g, pa.lid))
}

fn create_id(s: &Arc<Shared>, token: u64) -> Result<Ptr<rdma_cm_id>> {
    create_id_in(s, token, rdma_port_space::RDMA_PS_TCP)
}

fn create_id_in(
    s: &Arc<Shared>,
    token: u64,
    space: rdma_port_space::Type,
) -> Result<Ptr<rdma_cm_id>> {
    let mut id = std::ptr::null_mut();
    // SAFETY: our channel; the context is a token, never dereferenced.
    let rc = unsafe {
        rdma_create_id(
            s.cm_channel.0,
            &mut id,
            token as usize as *mut libc::c_void,
            space,
        )
    };
    if rc != 0 {
        return Err(Error::NoResource(Resource::Device));
    }
    Ok(Ptr(id))
}

fn destroy_id(id: Ptr<rdma_cm_id>) {
    if !id.is_null() {
        // SAFETY: an id of ours whose events were all acknowledged as they were read.
        unsafe { rdma_destroy_id(id.0) };
    }
}

/// Starts rdma_cm's resolution of `remote` from the device's own address on `id`; false
/// when it could not start (errno says why).
fn start_resolve(s: &Shared, id: &Ptr<rdma_cm_id>, remote: SocketAddrV4) -> bool {
    let mut src = sys::sockaddr_in(SocketAddrV4::new(s.addr, 0));
    let mut dst = sys::sockaddr_in(remote);
    // SAFETY: our id and two sockaddr_in.
    let rc = unsafe {
        rdma_resolve_addr(
            id.0,
            &mut src as *mut _ as *mut libc::sockaddr,
            &mut dst as *mut _ as *mut libc::sockaddr,
            RESOLVE_MS,
        )
    };
    rc == 0
}

fn conn_param(qp: &VerbsQp, private_data: &[u8], limit: Option<(u8, u8)>) -> rdma_conn_param {
    let depth = qp
        .cap
        .max_rd_atomic
        .min(qp.shared.attr.max_rd_atomic)
        .min(255) as u8;
    let (rr, id) = match limit {
        Some((their_rr, their_id)) => (depth.min(their_id), depth.min(their_rr)),
        None => (depth, depth),
    };
    // SAFETY: plain data.
    let mut p: rdma_conn_param = unsafe { std::mem::zeroed() };
    p.private_data = if private_data.is_empty() {
        std::ptr::null()
    } else {
        private_data.as_ptr() as *const _
    };
    p.private_data_len = private_data.len().min(255) as u8;
    p.responder_resources = rr;
    p.initiator_depth = id;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    p.qp_num = qp.qp_num;
    p
}

// ---- listeners --------------------------------------------------------------------------

pub(crate) struct VerbsListener {
    shared: Arc<Shared>,
    token: u64,
    port: u16,
    closed: AtomicBool,
}

pub(super) fn listen(s: &Arc<Shared>, port: u16) -> Result<Arc<VerbsListener>> {
    let token = s.next_id();
    let id = create_id(s, token)?;
    let mut sin = sys::sockaddr_in(SocketAddrV4::new(s.addr, port));
    // SAFETY: our id and a sockaddr_in.
    let rc = unsafe { rdma_bind_addr(id.0, &mut sin as *mut _ as *mut libc::sockaddr) };
    if rc != 0 {
        let e = sys::errno();
        destroy_id(id);
        return Err(if e == libc::EADDRINUSE {
            Error::AddrInUse
        } else {
            Error::NoResource(Resource::Device)
        });
    }
    // SAFETY: our bound id.
    if unsafe { rdma_listen(id.0, 128) } != 0 {
        destroy_id(id);
        return Err(Error::NoResource(Resource::Device));
    }
    // SAFETY: our bound id.
    let bound = u16::from_be(unsafe { rdma_get_src_port(id.0) });
    let ud = listen_ud(s, token, bound);
    let mut st = s.cm.lock();
    st.owners.insert(token, Owner::Listener);
    st.listeners.insert(token, id);
    if let Some(ud) = ud {
        st.ud_listeners.insert(token, ud);
    }
    Ok(Arc::new(VerbsListener {
        shared: s.clone(),
        token,
        port: bound,
        closed: AtomicBool::new(false),
    }))
}

/// The listener's twin in the UDP port space, for datagram requests (None, logged, if that
/// port is taken there: the listener then serves connections only).
fn listen_ud(s: &Arc<Shared>, token: u64, port: u16) -> Option<Ptr<rdma_cm_id>> {
    let id = create_id_in(s, token, rdma_port_space::RDMA_PS_UDP).ok()?;
    let mut sin = sys::sockaddr_in(SocketAddrV4::new(s.addr, port));
    // SAFETY: our id and a sockaddr_in.
    let bound = unsafe { rdma_bind_addr(id.0, &mut sin as *mut _ as *mut libc::sockaddr) } == 0
        // SAFETY: our bound id.
        && unsafe { rdma_listen(id.0, 128) } == 0;
    if !bound {
        log::info!(
            "port {port}: no datagram requests (UDP port space: errno {})",
            sys::errno()
        );
        destroy_id(id);
        return None;
    }
    Some(id)
}

impl Listener for VerbsListener {
    fn id(&self) -> u64 {
        self.token
    }
    fn port(&self) -> u16 {
        self.port
    }
    fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        let (id, ud) = {
            let mut st = self.shared.cm.lock();
            st.owners.remove(&self.token);
            (
                st.listeners.remove(&self.token),
                st.ud_listeners.remove(&self.token),
            )
        };
        for id in [id, ud].into_iter().flatten() {
            destroy_id(id);
        }
    }
}

impl Drop for VerbsListener {
    fn drop(&mut self) {
        self.close();
    }
}

// ---- active side ------------------------------------------------------------------------

pub(super) fn connect(
    s: &Arc<Shared>,
    qp: Arc<VerbsQp>,
    remote: SocketAddrV4,
    private_data: &[u8],
    timeout: Option<Duration>,
) -> Result<()> {
    let mut c = qp.conn.lock();
    if qp.phase() != Phase::Idle {
        return Err(Error::BadState);
    }
    let token = s.next_id();
    let id = create_id(s, token)?;
    s.cm.lock().owners.insert(token, Owner::Qp(qp.qp_num));
    c.cm_id = id;
    qp.set_phase(Phase::Connecting);
    c.private_data = private_data.to_vec();
    c.remote = Some(remote);
    c.disconnecting = false;
    if let Some(t) = timeout {
        let d = Instant::now() + t;
        c.deadline = Some(d);
        s.cm.lock().deadlines.insert(qp.qp_num, d);
        s.kick();
    }
    if !start_resolve(s, &id, remote) {
        log::debug!(
            "QP {}: rdma_resolve_addr({remote}): errno {}",
            qp.qp_num,
            sys::errno()
        );
        fail_locked(s, &qp, &mut c, CmEvent::Unreachable { qp_num: qp.qp_num });
    }
    Ok(())
}

/// The connection attempt or connection of `qp` is over: QP to ERR (flushing), id destroyed,
/// `ev` reported. Called with the QP's `conn` lock held.
fn fail_locked(s: &Arc<Shared>, qp: &VerbsQp, c: &mut super::qp::Conn, ev: CmEvent) {
    qp.set_phase(Phase::Error);
    c.deadline = None;
    qp.to_error();
    let id = std::mem::replace(&mut c.cm_id, Ptr::null());
    forget_id(s, qp.qp_num);
    destroy_id(id);
    s.defer_event(ev);
}

fn forget_id(s: &Arc<Shared>, qp_num: u32) {
    let mut st = s.cm.lock();
    st.owners
        .retain(|_, o| !matches!(o, Owner::Qp(n) if *n == qp_num));
    st.deadlines.remove(&qp_num);
}

// ---- passive side -----------------------------------------------------------------------

pub(super) fn accept(
    s: &Arc<Shared>,
    req: ConnRequestId,
    qp: Arc<VerbsQp>,
    private_data: &[u8],
) -> Result<()> {
    let mut c = qp.conn.lock();
    if qp.phase() != Phase::Idle {
        return Err(Error::BadState);
    }
    let r = {
        let mut st = s.cm.lock();
        let r = st.requests.remove(&req).ok_or(Error::BadState)?;
        st.owners.insert(req, Owner::Qp(qp.qp_num));
        r
    };
    // SAFETY: the request's id, now owned by this QP.
    let (local, remote) = unsafe { addresses(r.id.0) };
    c.cm_id = r.id;
    qp.set_phase(Phase::Connecting);
    c.local = Some(local);
    c.remote = Some(remote);
    c.disconnecting = false;
    let result = qp.to_rts(r.id.0).and_then(|_| {
        let mut p = conn_param(
            &qp,
            private_data,
            Some((r.responder_resources, r.initiator_depth)),
        );
        // SAFETY: the request's id and a parameter block that lives across the call.
        let rc = unsafe { rdma_accept(r.id.0, &mut p) };
        if rc != 0 {
            Err(sys::os_error("rdma_accept", sys::errno()))
        } else {
            Ok(())
        }
    });
    if let Err(e) = result {
        log::warn!("QP {}: accept failed: {e}", qp.qp_num);
        // SAFETY: the id is still ours.
        unsafe { rdma_reject(r.id.0, std::ptr::null(), 0) };
        qp.set_phase(Phase::Idle);
        c.local = None;
        c.remote = None;
        c.cm_id = Ptr::null();
        forget_id(s, qp.qp_num);
        destroy_id(r.id);
        // Back to INIT for another try: the QP may have reached RTR.
        drop(c);
        return Err(Error::NoResource(Resource::Qp));
    }
    Ok(())
}

/// Answers a datagram QP's request with `qp`'s number and `private_data`; returns an address
/// handle for the requester's QP.
pub(super) fn ud_accept(
    s: &Arc<Shared>,
    req: ConnRequestId,
    qp: Arc<VerbsQp>,
    private_data: &[u8],
) -> Result<UdPeer> {
    if !qp.ud || qp.phase() != Phase::Connected {
        return Err(Error::BadState);
    }
    let mut r = {
        let mut st = s.cm.lock();
        match st.requests.get(&req) {
            Some(r) if r.ud.is_some() => {}
            _ => return Err(Error::BadState),
        }
        st.owners.remove(&req);
        st.requests.remove(&req)
    }
    .ok_or(Error::BadState)?;
    let Some(remote) = r.ud.take() else {
        return Err(Error::Internal);
    };
    // SAFETY: the request's id.
    let (_, from) = unsafe { addresses(r.id.0) };
    // The path back to the requester: its GID (and LID) from our own GID entry.
    let Some((sgid_index, _, _)) = ud_local_address(s) else {
        // SAFETY: the request's id.
        unsafe { rdma_reject(r.id.0, std::ptr::null(), 0) };
        destroy_id(r.id);
        return Err(Error::NoResource(Resource::Qp));
    };
    // SAFETY: plain data.
    let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
    attr.is_global = 1;
    attr.grh.dgid.raw = remote.gid;
    attr.grh.sgid_index = sgid_index;
    attr.grh.hop_limit = 64;
    attr.dlid = remote.lid;
    attr.port_num = s.port;
    let ah = match VerbsAh::create(qp.pd(), &mut attr, *from.ip(), RDMA_UDP_QKEY) {
        Ok(ah) => ah,
        Err(why) => {
            log::warn!("datagram QP {}: {why}", qp.qp_num);
            // SAFETY: the request's id.
            unsafe { rdma_reject(r.id.0, std::ptr::null(), 0) };
            destroy_id(r.id);
            return Err(Error::NoResource(Resource::Qp));
        }
    };
    let data = ud_answer_data(private_data);
    let mut p = conn_param(&qp, &data, None);
    // SAFETY: the request's id and a parameter block that lives across the call (the SIDR
    // reply is sent before it returns, so the id goes right after).
    let rc = unsafe { rdma_accept(r.id.0, &mut p) };
    let errno = sys::errno();
    destroy_id(r.id);
    if rc != 0 {
        log::warn!(
            "datagram QP {}: {}",
            qp.qp_num,
            sys::os_error("rdma_accept", errno)
        );
        return Err(Error::NoResource(Resource::Qp));
    }
    Ok(UdPeer {
        ah,
        qpn: remote.qpn,
    })
}

pub(super) fn reject(s: &Arc<Shared>, req: ConnRequestId, private_data: &[u8]) -> Result<()> {
    let r = {
        let mut st = s.cm.lock();
        st.owners.remove(&req);
        st.requests.remove(&req)
    }
    .ok_or(Error::BadState)?;
    // A datagram request's answer says how long its private data is (see the module).
    let framed;
    let private_data = if r.ud.is_some() {
        framed = ud_answer_data(private_data);
        &framed[..]
    } else {
        private_data
    };
    // SAFETY: the request's id; private data lives across the call.
    unsafe {
        rdma_reject(
            r.id.0,
            private_data.as_ptr() as *const _,
            private_data.len().min(148) as u8,
        )
    };
    destroy_id(r.id);
    Ok(())
}

/// (local, remote) addresses of a connected or requesting id.
///
/// # Safety
/// `id` must be a live CM id.
unsafe fn addresses(id: *mut rdma_cm_id) -> (SocketAddrV4, SocketAddrV4) {
    // SAFETY: the caller's id; rdma_cm keeps IPv4 addresses as sockaddr_in.
    unsafe {
        let a = &(*id).route.addr;
        (
            sys::from_sockaddr_in(&a.src_addr_union.src_sin),
            sys::from_sockaddr_in(&a.dst_addr_union.dst_sin),
        )
    }
}

// ---- both sides -------------------------------------------------------------------------

pub(super) fn disconnect(s: &Arc<Shared>, qp: Arc<VerbsQp>, abrupt: bool) -> Result<()> {
    if qp.ud {
        // No connection: the QP stops (everything posted is flushed) until reset.
        let _c = qp.conn.lock();
        if qp.phase() == Phase::Connected {
            qp.set_phase(Phase::Error);
            qp.to_error();
            s.defer_event(CmEvent::Disconnected { qp_num: qp.qp_num });
        }
        return Ok(());
    }
    let phase = qp.phase();
    if phase == Phase::Connected && !abrupt {
        // Graceful: what was posted completes before the peer is told.
        qp.wait_flushed(true);
    }
    let mut c = qp.conn.lock();
    match qp.phase() {
        Phase::Connected => {
            c.disconnecting = true;
            if abrupt {
                qp.to_error();
            }
            // SAFETY: the QP's live id (under its conn lock).
            unsafe { rdma_disconnect(c.cm_id.0) };
        }
        Phase::Connecting => {
            fail_locked(s, &qp, &mut c, CmEvent::Disconnected { qp_num: qp.qp_num });
        }
        Phase::Idle | Phase::Error => {}
    }
    Ok(())
}

/// The QP failed: tell the peer and the core.
pub(super) fn break_connection(s: &Arc<Shared>, qp_num: u32) {
    let Some(qp) = s.qp(qp_num) else { return };
    let mut c = qp.conn.lock();
    if qp.ud {
        // A datagram QP the device failed (a fatal asynchronous event): it stops.
        if qp.phase() == Phase::Connected {
            qp.set_phase(Phase::Error);
            qp.to_error();
            s.defer_event(CmEvent::Broken { qp_num });
        }
        return;
    }
    match qp.phase() {
        Phase::Connected => {
            qp.set_phase(Phase::Error);
            c.disconnecting = true;
            qp.to_error();
            // The id stays until the peer's answer (DISCONNECTED) arrives.
            // SAFETY: the QP's live id.
            unsafe { rdma_disconnect(c.cm_id.0) };
            s.defer_event(CmEvent::Broken { qp_num });
        }
        Phase::Connecting => {
            fail_locked(s, &qp, &mut c, CmEvent::Broken { qp_num });
        }
        Phase::Idle | Phase::Error => {}
    }
}

impl Shared {
    /// Destroys the CM id of a QP that is being destroyed or reset, and ends the datagram
    /// resolutions it has under way (without an event: nobody is left to see it).
    pub(super) fn release_cm_id(self: &Arc<Self>, qp: &VerbsQp) {
        let mut c = qp.conn.lock();
        let id = std::mem::replace(&mut c.cm_id, Ptr::null());
        forget_id(self, qp.qp_num);
        drop(c);
        destroy_id(id);
        let tokens: Vec<u64> = self
            .cm
            .lock()
            .ud
            .iter()
            .filter(|(_, r)| r.qp.qp_num() == qp.qp_num)
            .map(|(t, _)| *t)
            .collect();
        for t in tokens {
            ud_end(self, t);
        }
    }
}

/// Milliseconds until the next connect deadline (-1: none).
pub(super) fn next_timeout_ms(s: &Arc<Shared>) -> i32 {
    let st = s.cm.lock();
    let ud = st.ud.values().filter_map(|r| r.deadline);
    match st.deadlines.values().copied().chain(ud).min() {
        None => -1,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            (left.as_millis().min(10_000) as i32).max(1)
        }
    }
}

/// Connects whose timeout passed end with TIMED_OUT.
pub(super) fn expire(s: &Arc<Shared>) {
    let now = Instant::now();
    let due: Vec<u32> =
        s.cm.lock()
            .deadlines
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(q, _)| *q)
            .collect();
    for qp_num in due {
        s.cm.lock().deadlines.remove(&qp_num);
        let Some(qp) = s.qp(qp_num) else { continue };
        let mut c = qp.conn.lock();
        if qp.phase() == Phase::Connecting {
            fail_locked(s, &qp, &mut c, CmEvent::TimedOut { qp_num });
        }
    }
    let due: Vec<u64> =
        s.cm.lock()
            .ud
            .iter()
            .filter(|(_, r)| r.deadline.is_some_and(|d| d <= now))
            .map(|(t, _)| *t)
            .collect();
    for token in due {
        ud_failed(s, token, false, Vec::new());
    }
}

/// Destroys what is left when the IA closes: listeners and requests nobody answered.
pub(super) fn close_all(s: &Arc<Shared>) {
    let (listeners, requests, ud_listeners, ud) = {
        let mut st = s.cm.lock();
        (
            std::mem::take(&mut st.listeners),
            std::mem::take(&mut st.requests),
            std::mem::take(&mut st.ud_listeners),
            std::mem::take(&mut st.ud),
        )
    };
    for (_, r) in requests {
        // SAFETY: an unanswered request's id.
        unsafe { rdma_reject(r.id.0, std::ptr::null(), 0) };
        destroy_id(r.id);
    }
    for (_, id) in listeners.into_iter().chain(ud_listeners) {
        destroy_id(id);
    }
    for (_, r) in ud {
        destroy_id(r.id);
    }
}

// ---- the event channel ------------------------------------------------------------------

/// An event, copied before it is acknowledged.
struct Ev {
    kind: rdma_cm_event_type::Type,
    status: i32,
    id: Ptr<rdma_cm_id>,
    token: u64,
    listen_token: u64,
    private_data: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
    /// An event of the UDP port space: what it says of the remote datagram QP.
    ud: Option<UdRemote>,
}

pub(super) fn events(s: &Arc<Shared>) {
    loop {
        let mut ev = std::ptr::null_mut();
        // SAFETY: our non-blocking channel.
        if unsafe { rdma_get_cm_event(s.cm_channel.0, &mut ev) } != 0 {
            break;
        }
        // SAFETY: the event and its ids stay valid until acknowledged.
        let e = unsafe {
            let r = &*ev;
            let conn = &r.param.conn;
            let pd = if conn.private_data.is_null() || conn.private_data_len == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data as *const u8,
                    conn.private_data_len as usize,
                )
                .to_vec()
            };
            Ev {
                kind: r.event,
                status: r.status,
                id: Ptr(r.id),
                token: (*r.id).context as usize as u64,
                listen_token: if r.listen_id.is_null() {
                    0
                } else {
                    (*r.listen_id).context as usize as u64
                },
                private_data: pd,
                responder_resources: conn.responder_resources,
                initiator_depth: conn.initiator_depth,
                // The `ud` view of the parameters (its private data is where `conn`'s is).
                ud: ((*r.id).ps == rdma_port_space::RDMA_PS_UDP).then_some(UdRemote {
                    ah_attr: r.param.ud.ah_attr,
                    qp_num: r.param.ud.qp_num,
                    qkey: r.param.ud.qkey,
                }),
            }
        };
        // SAFETY: acknowledged once, before handling, so handlers may destroy ids.
        unsafe { rdma_ack_cm_event(ev) };
        handle(s, e);
    }
}

fn handle(s: &Arc<Shared>, e: Ev) {
    use rdma_cm_event_type::*;
    log::debug!(
        "verbs cm: event {} status {} token {}",
        // SAFETY: returns a static string.
        sys::cstr(unsafe { rdma_event_str(e.kind) }),
        e.status,
        e.token
    );
    if e.kind == RDMA_CM_EVENT_CONNECT_REQUEST {
        return connect_request(s, e);
    }
    // On any id of the IA: the device is going (fault.rs); the id's own owner still hears of
    // it below.
    if e.kind == RDMA_CM_EVENT_DEVICE_REMOVAL {
        super::fault::device_removed(s);
    }
    let owner = {
        let st = s.cm.lock();
        match st.owners.get(&e.token) {
            Some(Owner::Qp(n)) => Some(Owner::Qp(*n)),
            Some(Owner::Request) => Some(Owner::Request),
            Some(Owner::Listener) => Some(Owner::Listener),
            Some(Owner::Ud) => Some(Owner::Ud),
            None => None,
        }
    };
    match owner {
        Some(Owner::Qp(qp_num)) => qp_event(s, qp_num, e),
        Some(Owner::Ud) => ud_event(s, e),
        Some(Owner::Request) => {
            // The requester gave up before the request was answered.
            let r = {
                let mut st = s.cm.lock();
                st.owners.remove(&e.token);
                st.requests.remove(&e.token)
            };
            if let Some(r) = r {
                destroy_id(r.id);
                s.defer_event(CmEvent::RequestCancelled {
                    listener: r.listener,
                    req: e.token,
                });
            }
        }
        Some(Owner::Listener) | None => {}
    }
}

fn connect_request(s: &Arc<Shared>, e: Ev) {
    let mut st = s.cm.lock();
    if !st.listeners.contains_key(&e.listen_token) {
        drop(st);
        // SAFETY: the new id is ours to answer and destroy.
        unsafe { rdma_reject(e.id.0, std::ptr::null(), 0) };
        destroy_id(e.id);
        return;
    }
    // A datagram request says where its QP is in the header before the consumer's data.
    let (ud, private_data) = if e.ud.is_some() {
        match ud_parse_request(&e.private_data) {
            Some((who, pd)) => (Some(who), pd),
            None => {
                drop(st);
                log::info!("a datagram request without our header: refused");
                // SAFETY: the new id is ours to answer and destroy.
                unsafe { rdma_reject(e.id.0, std::ptr::null(), 0) };
                destroy_id(e.id);
                return;
            }
        }
    } else {
        (None, e.private_data)
    };
    let req = s.next_id();
    // SAFETY: the new id is ours; its context becomes the request's token.
    let (local, remote) = unsafe {
        (*e.id.0).context = req as usize as *mut libc::c_void;
        addresses(e.id.0)
    };
    st.owners.insert(req, Owner::Request);
    st.requests.insert(
        req,
        Request {
            id: e.id,
            listener: e.listen_token,
            responder_resources: e.responder_resources,
            initiator_depth: e.initiator_depth,
            ud,
        },
    );
    drop(st);
    let ev = if ud.is_some() {
        CmEvent::UdRequest {
            listener: e.listen_token,
            req,
            private_data,
            remote,
            local,
        }
    } else {
        CmEvent::ConnectRequest {
            listener: e.listen_token,
            req,
            private_data,
            remote,
            local,
        }
    };
    s.defer_event(ev);
}

// ---- datagram address resolution ----------------------------------------------------------

/// Starts resolving the datagram QP a consumer accepts with behind `remote`, for datagram QP
/// `qp`; returns the token its outcome carries.
pub(super) fn ud_resolve(
    s: &Arc<Shared>,
    qp: Arc<VerbsQp>,
    remote: SocketAddrV4,
    private_data: &[u8],
    timeout: Option<Duration>,
) -> Result<u64> {
    if !qp.ud || qp.phase() != Phase::Connected {
        return Err(Error::BadState);
    }
    let (_, gid, lid) = ud_local_address(s).ok_or(Error::NoResource(Resource::Device))?;
    let hello = ud_request_data(
        &UdRequester {
            qpn: qp.qp_num,
            lid,
            gid,
        },
        private_data,
    );
    let token = s.next_id();
    let id = create_id_in(s, token, rdma_port_space::RDMA_PS_UDP)?;
    let deadline = timeout.map(|t| Instant::now() + t);
    {
        let mut st = s.cm.lock();
        st.owners.insert(token, Owner::Ud);
        st.ud.insert(
            token,
            UdResolution {
                id,
                qp,
                remote,
                private_data: hello,
                deadline,
            },
        );
    }
    if deadline.is_some() {
        s.kick();
    }
    if !start_resolve(s, &id, remote) {
        log::debug!(
            "datagram resolution {token}: rdma_resolve_addr({remote}): errno {}",
            sys::errno()
        );
        ud_failed(s, token, false, Vec::new());
    }
    Ok(token)
}

/// Ends a resolution (its id goes) and returns it, if it was still under way.
fn ud_end(s: &Arc<Shared>, token: u64) -> Option<UdResolution> {
    let r = {
        let mut st = s.cm.lock();
        st.owners.remove(&token);
        st.ud.remove(&token)
    }?;
    destroy_id(r.id);
    Some(r)
}

fn ud_failed(s: &Arc<Shared>, token: u64, by_peer: bool, private_data: Vec<u8>) {
    if let Some(r) = ud_end(s, token) {
        s.defer_event(CmEvent::UdFailed {
            qp_num: r.qp.qp_num(),
            id: token,
            by_peer,
            private_data,
        });
    }
}

fn ud_event(s: &Arc<Shared>, e: Ev) {
    use rdma_cm_event_type::*;
    let token = e.token;
    let (id, qp, private_data) = {
        let st = s.cm.lock();
        let Some(r) = st.ud.get(&token) else { return };
        if r.id.0 != e.id.0 {
            return;
        }
        (r.id.0, r.qp.clone(), r.private_data.clone())
    };
    let Some(qp) = qp.as_any().downcast_ref::<VerbsQp>() else {
        return; // only ours are kept (`ud_resolve`)
    };
    match e.kind {
        // SAFETY: the resolution's live id.
        RDMA_CM_EVENT_ADDR_RESOLVED if unsafe { rdma_resolve_route(id, RESOLVE_MS) } != 0 => {
            ud_failed(s, token, false, Vec::new());
        }
        RDMA_CM_EVENT_ROUTE_RESOLVED => {
            // SAFETY: the resolution's live id.
            if unsafe { (*id).verbs } != s.ctx.0 {
                log::warn!("datagram resolution {token}: the route leaves through another device");
                return ud_failed(s, token, false, Vec::new());
            }
            let mut p = conn_param(qp, &private_data, None);
            // SAFETY: the live id; the private data lives across the call.
            if unsafe { rdma_connect(id, &mut p) } != 0 {
                ud_failed(s, token, false, Vec::new());
            }
        }
        RDMA_CM_EVENT_ESTABLISHED => {
            let Some(mut remote) = e.ud else {
                return ud_failed(s, token, false, Vec::new());
            };
            let Some(r) = ud_end(s, token) else { return };
            match VerbsAh::create(qp.pd(), &mut remote.ah_attr, *r.remote.ip(), remote.qkey) {
                Ok(ah) => s.defer_event(CmEvent::UdResolved {
                    qp_num: qp.qp_num,
                    id: token,
                    peer: UdPeer {
                        ah,
                        qpn: remote.qp_num,
                    },
                    private_data: ud_answer_private_data(&e.private_data),
                }),
                Err(why) => {
                    log::warn!("datagram resolution {token}: {why}");
                    s.defer_event(CmEvent::UdFailed {
                        qp_num: qp.qp_num,
                        id: token,
                        by_peer: false,
                        private_data: Vec::new(),
                    });
                }
            }
        }
        // A SIDR reply that is not a success: the remote consumer rejected (its private data
        // comes along), or nobody serves datagrams there.
        RDMA_CM_EVENT_UNREACHABLE | RDMA_CM_EVENT_REJECTED => {
            let by_peer = e.status == SIDR_REJECT || e.status == REJ_CONSUMER_DEFINED;
            let pd = if by_peer {
                ud_answer_private_data(&e.private_data)
            } else {
                Vec::new()
            };
            ud_failed(s, token, by_peer, pd);
        }
        RDMA_CM_EVENT_ADDR_ERROR
        | RDMA_CM_EVENT_ROUTE_ERROR
        | RDMA_CM_EVENT_CONNECT_ERROR
        | RDMA_CM_EVENT_DEVICE_REMOVAL => ud_failed(s, token, false, Vec::new()),
        _ => {}
    }
}

fn qp_event(s: &Arc<Shared>, qp_num: u32, e: Ev) {
    use rdma_cm_event_type::*;
    let Some(qp) = s.qp(qp_num) else { return };
    let mut c = qp.conn.lock();
    if c.cm_id.0 != e.id.0 {
        return; // an id this QP no longer uses
    }
    let id = c.cm_id.0;
    match e.kind {
        // SAFETY: the QP's live id.
        RDMA_CM_EVENT_ADDR_RESOLVED if unsafe { rdma_resolve_route(id, RESOLVE_MS) } != 0 => {
            fail_locked(s, &qp, &mut c, CmEvent::Unreachable { qp_num });
        }
        RDMA_CM_EVENT_ROUTE_RESOLVED => {
            // SAFETY: the QP's live id.
            if unsafe { (*id).verbs } != s.ctx.0 {
                log::warn!("QP {qp_num}: the route to the peer leaves through another device");
                return fail_locked(s, &qp, &mut c, CmEvent::Unreachable { qp_num });
            }
            let pd = c.private_data.clone();
            let mut p = conn_param(&qp, &pd, None);
            // SAFETY: the QP's live id; `pd` lives across the call.
            if unsafe { rdma_connect(id, &mut p) } != 0 {
                // iWARP connects the TCP stream inside rdma_connect: nobody listening at the
                // port is a refused connect there (on IB, a REJ from the peer's CM), which
                // DAT reports as NON_PEER_REJECTED on every transport.
                let ev = if sys::errno() == libc::ECONNREFUSED {
                    CmEvent::Rejected {
                        qp_num,
                        private_data: Vec::new(),
                        by_peer: false,
                    }
                } else {
                    CmEvent::Unreachable { qp_num }
                };
                fail_locked(s, &qp, &mut c, ev);
            }
        }
        RDMA_CM_EVENT_CONNECT_RESPONSE => {
            if let Err(why) = qp.to_rts(id) {
                log::warn!("QP {qp_num}: {why}");
                // SAFETY: the QP's live id.
                unsafe { rdma_reject(id, std::ptr::null(), 0) };
                return fail_locked(s, &qp, &mut c, CmEvent::Broken { qp_num });
            }
            // SAFETY: the QP's live id.
            if unsafe { rdma_establish(id) } != 0 {
                return fail_locked(s, &qp, &mut c, CmEvent::Broken { qp_num });
            }
            // SAFETY: the QP's live id.
            c.local = Some(unsafe { addresses(id) }.0);
            established(s, &qp, &mut c, e.private_data);
        }
        RDMA_CM_EVENT_ESTABLISHED => {
            established(s, &qp, &mut c, e.private_data);
        }
        // The peer never answered (the CM's retries ran out) or no path leads to it; the
        // consumer's own connect timeout is TIMED_OUT (see `expire`).
        RDMA_CM_EVENT_ADDR_ERROR | RDMA_CM_EVENT_ROUTE_ERROR | RDMA_CM_EVENT_UNREACHABLE => {
            fail_locked(s, &qp, &mut c, CmEvent::Unreachable { qp_num });
        }
        RDMA_CM_EVENT_REJECTED => {
            // IB: the peer's consumer rejects with the reason "consumer defined". iWARP: an
            // MPA reply with the reject bit (the peer's rdma_reject) reads -ECONNRESET
            // (siw_cm.c; the same as a stream reset before the MPA reply), a refused
            // connection -ECONNREFUSED.
            let by_peer = if s.iwarp {
                e.status == -libc::ECONNRESET
            } else {
                e.status == REJ_CONSUMER_DEFINED
            };
            let ev = CmEvent::Rejected {
                qp_num,
                private_data: e.private_data,
                by_peer,
            };
            fail_locked(s, &qp, &mut c, ev);
        }
        RDMA_CM_EVENT_CONNECT_ERROR | RDMA_CM_EVENT_DEVICE_REMOVAL => {
            fail_locked(s, &qp, &mut c, CmEvent::Broken { qp_num });
        }
        RDMA_CM_EVENT_DISCONNECTED => {
            let was = qp.phase();
            if !c.disconnecting {
                // The peer asked: answer, or it waits for a timeout.
                // SAFETY: the QP's live id.
                unsafe { rdma_disconnect(id) };
            }
            if was == Phase::Error {
                // Already reported (a broken connection): only the id is left to free.
                let id = std::mem::replace(&mut c.cm_id, Ptr::null());
                forget_id(s, qp_num);
                destroy_id(id);
            } else {
                // A peer that disconnects after a failed request (a remote access it refused,
                // or one we made) ends a broken connection, not an orderly one; so does one
                // whose device went (fault.rs: the first IA to hear of it broke its side).
                let broken = !c.disconnecting && (qp.failed() || s.lost.load(Ordering::SeqCst));
                if broken {
                    qp.broken.store(true, Ordering::SeqCst);
                }
                let ev = if broken {
                    CmEvent::Broken { qp_num }
                } else {
                    CmEvent::Disconnected { qp_num }
                };
                fail_locked(s, &qp, &mut c, ev);
            }
        }
        _ => {}
    }
}

fn established(s: &Arc<Shared>, qp: &VerbsQp, c: &mut super::qp::Conn, private_data: Vec<u8>) {
    let qp_num = qp.qp_num;
    if qp.phase() != Phase::Connecting {
        return;
    }
    qp.set_phase(Phase::Connected);
    c.deadline = None;
    s.cm.lock().deadlines.remove(&qp_num);
    s.defer_event(CmEvent::Established {
        qp_num,
        private_data,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_requests_carry_the_requester_and_the_exact_private_data() {
        let who = UdRequester {
            qpn: 0x00ab_cdef,
            lid: 7,
            gid: std::net::Ipv4Addr::new(192, 0, 2, 1)
                .to_ipv6_mapped()
                .octets(),
        };
        let mut d = ud_request_data(&who, b"four");
        // rdma_cm pads what arrives to SIDR's fixed size.
        d.resize(180, 0);
        assert_eq!(ud_parse_request(&d), Some((who, b"four".to_vec())));
        assert_eq!(ud_parse_request(&d[..UD_REQUEST_HEADER + 3]), None);
        assert_eq!(ud_parse_request(&[0u8; 180]), None);

        let mut a = ud_answer_data(b"ok");
        a.resize(136, 0);
        assert_eq!(ud_answer_private_data(&a), b"ok");
        // Not ours: what came.
        assert_eq!(ud_answer_private_data(b"plain"), b"plain");
    }
}
