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

use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::*;

use super::qp::{Phase, VerbsQp};
use super::sys::{self, Ptr};
use super::Shared;
use crate::backend::{CmEvent, ConnRequestId, Listener};
use crate::core::error::{DatError, DatResult, ErrorType, SubType};

/// rdma_cm's address and route resolution timeout.
const RESOLVE_MS: i32 = 2000;
/// IB CM reject reason "consumer defined": the peer's application said no.
const REJ_CONSUMER_DEFINED: i32 = 28;

enum Owner {
    Listener,
    Request,
    Qp(u32),
}

struct Request {
    id: Ptr<rdma_cm_id>,
    listener: u64,
    /// What the requester offered: our accept may not ask for more.
    responder_resources: u8,
    initiator_depth: u8,
}

#[derive(Default)]
pub(super) struct CmState {
    owners: HashMap<u64, Owner>,
    requests: HashMap<u64, Request>,
    listeners: HashMap<u64, Ptr<rdma_cm_id>>,
    /// Connects with a timeout: qp_num -> when they give up.
    deadlines: HashMap<u32, Instant>,
}

fn create_id(s: &Arc<Shared>, token: u64) -> DatResult<Ptr<rdma_cm_id>> {
    let mut id = std::ptr::null_mut();
    // SAFETY: our channel; the context is a token, never dereferenced.
    let rc = unsafe {
        rdma_create_id(
            s.cm_channel.0,
            &mut id,
            token as usize as *mut libc::c_void,
            rdma_port_space::RDMA_PS_TCP,
        )
    };
    if rc != 0 {
        return Err(DatError::resources(SubType::ResourceDevice));
    }
    Ok(Ptr(id))
}

fn destroy_id(id: Ptr<rdma_cm_id>) {
    if !id.is_null() {
        // SAFETY: an id of ours whose events were all acknowledged as they were read.
        unsafe { rdma_destroy_id(id.0) };
    }
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

pub(super) fn listen(s: &Arc<Shared>, port: u16) -> DatResult<Arc<VerbsListener>> {
    let token = s.next_id();
    let id = create_id(s, token)?;
    let mut sin = sys::sockaddr_in(SocketAddrV4::new(s.addr, port));
    // SAFETY: our id and a sockaddr_in.
    let rc = unsafe { rdma_bind_addr(id.0, &mut sin as *mut _ as *mut libc::sockaddr) };
    if rc != 0 {
        let e = sys::errno();
        destroy_id(id);
        return Err(if e == libc::EADDRINUSE {
            DatError::plain(ErrorType::ConnQualInUse)
        } else {
            DatError::resources(SubType::ResourceDevice)
        });
    }
    // SAFETY: our bound id.
    if unsafe { rdma_listen(id.0, 128) } != 0 {
        destroy_id(id);
        return Err(DatError::resources(SubType::ResourceDevice));
    }
    // SAFETY: our bound id.
    let bound = u16::from_be(unsafe { rdma_get_src_port(id.0) });
    let mut st = s.cm.lock();
    st.owners.insert(token, Owner::Listener);
    st.listeners.insert(token, id);
    Ok(Arc::new(VerbsListener {
        shared: s.clone(),
        token,
        port: bound,
        closed: AtomicBool::new(false),
    }))
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
        let id = {
            let mut st = self.shared.cm.lock();
            st.owners.remove(&self.token);
            st.listeners.remove(&self.token)
        };
        if let Some(id) = id {
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
) -> DatResult<()> {
    let mut c = qp.conn.lock();
    if c.phase != Phase::Idle {
        return Err(DatError::invalid_state(SubType::None));
    }
    let token = s.next_id();
    let id = create_id(s, token)?;
    s.cm.lock().owners.insert(token, Owner::Qp(qp.qp_num));
    c.cm_id = id;
    c.phase = Phase::Connecting;
    c.private_data = private_data.to_vec();
    c.remote = Some(remote);
    c.disconnecting = false;
    if let Some(t) = timeout {
        let d = Instant::now() + t;
        c.deadline = Some(d);
        s.cm.lock().deadlines.insert(qp.qp_num, d);
        s.kick();
    }
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
    if rc != 0 {
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
    c.phase = Phase::Error;
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
) -> DatResult<()> {
    let mut c = qp.conn.lock();
    if c.phase != Phase::Idle {
        return Err(DatError::invalid_state(SubType::None));
    }
    let r = {
        let mut st = s.cm.lock();
        let r = st
            .requests
            .remove(&req)
            .ok_or(DatError::invalid_state(SubType::None))?;
        st.owners.insert(req, Owner::Qp(qp.qp_num));
        r
    };
    // SAFETY: the request's id, now owned by this QP.
    let (local, remote) = unsafe { addresses(r.id.0) };
    c.cm_id = r.id;
    c.phase = Phase::Connecting;
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
        c.phase = Phase::Idle;
        c.local = None;
        c.remote = None;
        c.cm_id = Ptr::null();
        forget_id(s, qp.qp_num);
        destroy_id(r.id);
        // Back to INIT for another try: the QP may have reached RTR.
        drop(c);
        return Err(DatError::resources(SubType::ResourceTep));
    }
    Ok(())
}

pub(super) fn reject(s: &Arc<Shared>, req: ConnRequestId, private_data: &[u8]) -> DatResult<()> {
    let r = {
        let mut st = s.cm.lock();
        st.owners.remove(&req);
        st.requests.remove(&req)
    }
    .ok_or(DatError::invalid_state(SubType::None))?;
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

pub(super) fn disconnect(s: &Arc<Shared>, qp: Arc<VerbsQp>, abrupt: bool) -> DatResult<()> {
    let phase = qp.phase();
    if phase == Phase::Connected && !abrupt {
        // Graceful: what was posted completes before the peer is told.
        qp.wait_flushed(true);
    }
    let mut c = qp.conn.lock();
    match c.phase {
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
    match c.phase {
        Phase::Connected => {
            c.phase = Phase::Error;
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
    /// Destroys the CM id of a QP that is being destroyed or reset.
    pub(super) fn release_cm_id(self: &Arc<Self>, qp: &VerbsQp) {
        let mut c = qp.conn.lock();
        let id = std::mem::replace(&mut c.cm_id, Ptr::null());
        forget_id(self, qp.qp_num);
        drop(c);
        destroy_id(id);
    }
}

/// Milliseconds until the next connect deadline (-1: none).
pub(super) fn next_timeout_ms(s: &Arc<Shared>) -> i32 {
    let st = s.cm.lock();
    match st.deadlines.values().min() {
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
        if c.phase == Phase::Connecting {
            fail_locked(s, &qp, &mut c, CmEvent::TimedOut { qp_num });
        }
    }
}

/// Destroys what is left when the IA closes: listeners and requests nobody answered.
pub(super) fn close_all(s: &Arc<Shared>) {
    let (listeners, requests) = {
        let mut st = s.cm.lock();
        (
            std::mem::take(&mut st.listeners),
            std::mem::take(&mut st.requests),
        )
    };
    for (_, r) in requests {
        // SAFETY: an unanswered request's id.
        unsafe { rdma_reject(r.id.0, std::ptr::null(), 0) };
        destroy_id(r.id);
    }
    for (_, id) in listeners {
        destroy_id(id);
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
    let owner = {
        let st = s.cm.lock();
        match st.owners.get(&e.token) {
            Some(Owner::Qp(n)) => Some(Owner::Qp(*n)),
            Some(Owner::Request) => Some(Owner::Request),
            Some(Owner::Listener) => Some(Owner::Listener),
            None => None,
        }
    };
    match owner {
        Some(Owner::Qp(qp_num)) => qp_event(s, qp_num, e),
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
        },
    );
    drop(st);
    s.defer_event(CmEvent::ConnectRequest {
        listener: e.listen_token,
        req,
        private_data: e.private_data,
        remote,
        local,
    });
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
                fail_locked(s, &qp, &mut c, CmEvent::Unreachable { qp_num });
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
            established(s, &mut c, qp_num, e.private_data);
        }
        RDMA_CM_EVENT_ESTABLISHED => {
            established(s, &mut c, qp_num, e.private_data);
        }
        // The peer never answered (the CM's retries ran out) or no path leads to it; the
        // consumer's own connect timeout is TIMED_OUT (see `expire`).
        RDMA_CM_EVENT_ADDR_ERROR | RDMA_CM_EVENT_ROUTE_ERROR | RDMA_CM_EVENT_UNREACHABLE => {
            fail_locked(s, &qp, &mut c, CmEvent::Unreachable { qp_num });
        }
        RDMA_CM_EVENT_REJECTED => {
            let ev = CmEvent::Rejected {
                qp_num,
                private_data: e.private_data,
                by_peer: e.status == REJ_CONSUMER_DEFINED,
            };
            fail_locked(s, &qp, &mut c, ev);
        }
        RDMA_CM_EVENT_CONNECT_ERROR | RDMA_CM_EVENT_DEVICE_REMOVAL => {
            fail_locked(s, &qp, &mut c, CmEvent::Broken { qp_num });
        }
        RDMA_CM_EVENT_DISCONNECTED => {
            let was = c.phase;
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
                // or one we made) ends a broken connection, not an orderly one.
                let broken = !c.disconnecting && qp.failed();
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

fn established(s: &Arc<Shared>, c: &mut super::qp::Conn, qp_num: u32, private_data: Vec<u8>) {
    if c.phase != Phase::Connecting {
        return;
    }
    c.phase = Phase::Connected;
    c.deadline = None;
    s.cm.lock().deadlines.remove(&qp_num);
    s.defer_event(CmEvent::Established {
        qp_num,
        private_data,
    });
}
