//! EP: an endpoint, its state machine and connection management; its data-transfer calls,
//! which become work requests on the EP's backend queue pair, are in `dto`.
//!
//! States (DAT_EP_STATE values): UNCONNECTED -> ACTIVE_CONNECTION_PENDING (connect) or
//! PASSIVE_CONNECTION_PENDING (accept) or RESERVED (RSP) -> TENTATIVE_CONNECTION_PENDING (request
//! on its RSP) -> CONNECTED -> DISCONNECT_PENDING -> DISCONNECTED -> (reset) UNCONNECTED.
//! An EP without a PZ is UNCONFIGURED_UNCONNECTED until dat_ep_modify gives it one.
//! A datagram EP (DAT_IB_SERVICE_TYPE_UD) has its own, smaller state machine: see `ud`.

mod dto;
mod ud;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::completion;
use super::consts::{async_reason, completion_flags, dto_op, evd_flags, event_number, mem_priv};
use super::counters;
use super::error::{from_backend, DatError, DatResult, ErrorType, Param, SubType};
use super::evd::{Evd, Event, EventData, EventSlot};
use super::handle_table::{self, AnyObject, Handle, HandleKind};
use super::ia::{Ia, QpOwner};
use super::pending::{carried_wr_id, Carried, EpShared, PendingDto, Received};
use super::pz::Pz;
use super::srq::Srq;
use daplrs_backend::{
    CompletionQueue, DeviceAttr, QpCap, QpInit, QueuePair, RecvWr, SendOp, SendWr, Sge, SgeList,
    WrContext,
};

/// DAT_EP_ATTR without the transport/provider-specific attribute lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpAttr {
    pub service_type: u32,
    pub max_message_size: u32,
    pub max_rdma_size: u32,
    pub qos: u32,
    pub recv_completion_flags: u32,
    pub request_completion_flags: u32,
    pub max_recv_dtos: u32,
    pub max_request_dtos: u32,
    pub max_recv_iov: u32,
    pub max_request_iov: u32,
    pub max_rdma_read_in: u32,
    pub max_rdma_read_out: u32,
    pub srq_soft_hw: u32,
    pub max_rdma_read_iov: u32,
    pub max_rdma_write_iov: u32,
}

impl EpAttr {
    /// The attributes an EP created without any gets.
    pub fn defaults(dev: &DeviceAttr) -> EpAttr {
        EpAttr {
            service_type: 0,
            max_message_size: dev.max_msg_size,
            max_rdma_size: dev.max_rdma_size,
            qos: 0,
            recv_completion_flags: completion_flags::DEFAULT,
            request_completion_flags: completion_flags::DEFAULT,
            max_recv_dtos: 64.min(dev.max_qp_wr),
            max_request_dtos: 64.min(dev.max_qp_wr),
            max_recv_iov: 4.min(dev.max_sge),
            max_request_iov: 4.min(dev.max_sge),
            max_rdma_read_in: 4.min(dev.max_rd_atomic),
            max_rdma_read_out: 4.min(dev.max_rd_atomic),
            srq_soft_hw: 0,
            max_rdma_read_iov: 4.min(dev.max_rdma_read_sge),
            max_rdma_write_iov: 4.min(dev.max_sge),
        }
    }

    /// Zero sizes and IOV lengths mean "the provider's default": OFED's
    /// provider reads them so, and its tools (dtest, dtestcm) create EPs
    /// from a zeroed DAT_EP_ATTR that sets only what they care about.
    pub fn with_defaults_for_zero(mut self, dev: &DeviceAttr) -> EpAttr {
        let d = EpAttr::defaults(dev);
        for (field, default) in [
            (&mut self.max_message_size, d.max_message_size),
            (&mut self.max_rdma_size, d.max_rdma_size),
            (&mut self.max_recv_iov, d.max_recv_iov),
            (&mut self.max_request_iov, d.max_request_iov),
            (&mut self.max_rdma_read_iov, d.max_rdma_read_iov),
            (&mut self.max_rdma_write_iov, d.max_rdma_write_iov),
        ] {
            if *field == 0 {
                *field = default;
            }
        }
        self
    }

    /// Checks the attributes against the device; `param` is the argument that carries them.
    ///
    /// recv_completion_flags name one notification mode for receive completions (see
    /// `core::evd`): DAT_COMPLETION_DEFAULT_FLAG (0), SOLICITED_WAIT, UNSIGNALLED or
    /// EVD_THRESHOLD, never two of them (DAT: an EVD is in the notify, solicited or threshold
    /// mode, not in a pair of them; "UNSIGNALLED for RECV is not allowed" with EVD_THRESHOLD),
    /// and no other bit. request_completion_flags are taken as given (OFED's provider reports
    /// EVD_THRESHOLD there, and its consumers hand its attributes back).
    pub fn validate(&self, dev: &DeviceAttr, param: Param) -> DatResult<()> {
        let recv_modes = completion_flags::SOLICITED_WAIT
            | completion_flags::UNSIGNALLED
            | completion_flags::EVD_THRESHOLD;
        let bad_recv_flags = self.recv_completion_flags & !recv_modes != 0
            || (self.recv_completion_flags & recv_modes).count_ones() > 1;
        // Connection EPs, and datagram EPs where the device has datagram QPs.
        let bad_service = match self.service_type {
            0 => false,
            super::consts::ib_ext::SERVICE_TYPE_UD => !dev.ud,
            _ => true,
        };
        let bad = bad_recv_flags
            || bad_service
            || self.max_message_size > dev.max_msg_size
            || self.max_rdma_size > dev.max_rdma_size
            || self.max_recv_dtos > dev.max_qp_wr
            || self.max_request_dtos > dev.max_qp_wr
            || self.max_recv_iov > dev.max_sge
            || self.max_request_iov > dev.max_sge
            || self.max_rdma_read_iov > dev.max_sge
            || self.max_rdma_write_iov > dev.max_sge
            || self.max_rdma_read_in > dev.max_rd_atomic
            || self.max_rdma_read_out > dev.max_rd_atomic;
        if bad {
            Err(DatError::bad(param))
        } else {
            Ok(())
        }
    }
}

/// An EP's state (DAT_EP_STATE): what the core's state machine keeps. The discriminants
/// are DAT's values, which only the C boundary reads (`as u32`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpState {
    Unconnected = 0,
    UnconfiguredUnconnected = 1,
    Reserved = 2,
    UnconfiguredReserved = 3,
    PassiveConnectionPending = 4,
    UnconfiguredPassive = 5,
    ActiveConnectionPending = 6,
    TentativeConnectionPending = 7,
    UnconfiguredTentative = 8,
    Connected = 9,
    DisconnectPending = 10,
    Disconnected = 11,
    CompletionPending = 12,
}

/// What dat_ep_query reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpParam {
    pub ia: Handle,
    pub state: EpState,
    pub local_address: Ipv4Addr,
    pub local_port: u64,
    pub remote_address: Option<Ipv4Addr>,
    pub remote_port: u64,
    pub pz: Handle,
    pub recv_evd: Handle,
    pub request_evd: Handle,
    pub connect_evd: Handle,
    pub srq: Handle,
    pub attr: EpAttr,
}

/// A remote buffer of an RDMA operation (DAT_RMR_TRIPLET).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteBuffer {
    pub address: u64,
    pub length: u32,
    pub rmr_context: u32,
}

/// Changes for dat_ep_modify; None leaves a field alone (Some(None) clears an EVD).
#[derive(Default)]
pub struct EpModify {
    pub pz: Option<Arc<Pz>>,
    pub recv_evd: Option<Option<Arc<Evd>>>,
    pub request_evd: Option<Option<Arc<Evd>>>,
    pub connect_evd: Option<Option<Arc<Evd>>>,
    pub attr: Option<EpAttr>,
}

struct EpInner {
    state: EpState,
    pz: Option<Arc<Pz>>,
    recv_evd: Option<Arc<Evd>>,
    request_evd: Option<Arc<Evd>>,
    connect_evd: Option<Arc<Evd>>,
    srq: Option<Arc<Srq>>,
    attr: EpAttr,
    qp: Option<Arc<dyn QueuePair>>,
    /// Completions of a QP whose EVD is NULL go here and are dropped.
    sink_cq: Option<Arc<dyn CompletionQueue>>,
    remote: Option<SocketAddrV4>,
    /// Private data the peer sent with its request or accept.
    peer_private_data: Arc<[u8]>,
    watermarks: Watermarks,
    /// Held by an RSP (RESERVED / TENTATIVE).
    reserved_by: Handle,
    freed: bool,
}

/// dat_ep_set_watermark's high watermarks for the Recv buffers at the EP: receives allocated to
/// it and not yet completed (dat_ep_recv_query's nbufs_allocated). Without an SRQ a receive is
/// allocated when it is posted; with one, when the EP takes it from the SRQ, which on both our
/// backends is the moment its message is placed and its completion generated, so an SRQ EP
/// holds none between calls and its watermarks never fire.
///
/// - Soft: the first time the count exceeds it (during dat_ep_set_watermark, or when a receive
///   is posted), one asynchronous event on the IA's async EVD: DAT_ASYNC_ERROR_EP_BROKEN (the
///   number DAT gives EP-affiliated asynchronous events) naming the EP, reason
///   DAT_SRQ_SOFT_HIGH_WATERMARK_EVENT; then none until the soft watermark is set again.
/// - Hard: while the EP is CONNECTED (from the moment the connection is established), a count
///   above it breaks the connection: an abrupt teardown (queues flushed, the peer told), the EP
///   DISCONNECT_PENDING until the backend has let go of the connection, then DISCONNECTED with
///   DAT_CONNECTION_EVENT_BROKEN on the connect EVD.
///
/// DAT_WATERMARK_INFINITE (-1), the default, sets no watermark. The EP attribute srq_soft_hw is
/// recorded and reported but does not set the soft watermark.
#[derive(Clone, Copy, Debug, Default)]
struct Watermarks {
    soft: Option<u32>,
    /// The soft event may still fire for the current setting.
    soft_armed: bool,
    hard: Option<u32>,
    /// The hard watermark is tearing the connection down: its end is reported as BROKEN.
    breaking: bool,
}

/// DAT_WATERMARK_INFINITE.
const WATERMARK_INFINITE: i32 = -1;

pub struct Ep {
    handle: Handle,
    ia: Arc<Ia>,
    inner: Mutex<EpInner>,
    /// The IOV limits of `inner`'s attributes, readable without its lock (`iov_limit`).
    iov_limits: IovLimits,
    /// Numbers the requests whose record the backend carries (`pending::carried_wr_id`).
    carried_seq: AtomicU64,
    pub(crate) shared: Arc<EpShared>,
    /// A datagram EP's address handles and resolution records (empty otherwise).
    ud: Mutex<ud::UdTables>,
}

/// Which IOV limit of an EP (`Ep::iov_limit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IovKind {
    Recv,
    Request,
    RdmaRead,
    RdmaWrite,
}

/// An EP's IOV limits as its attributes last set them, each an atomic: the post path reads
/// one without the EP's lock (taking it there cost a lock and an unlock per post).
struct IovLimits([AtomicU32; 4]);

impl IovLimits {
    fn of(attr: &EpAttr) -> IovLimits {
        let limits = IovLimits(Default::default());
        limits.set(attr);
        limits
    }

    fn set(&self, attr: &EpAttr) {
        for (kind, value) in [
            (IovKind::Recv, attr.max_recv_iov),
            (IovKind::Request, attr.max_request_iov),
            (IovKind::RdmaRead, attr.max_rdma_read_iov),
            (IovKind::RdmaWrite, attr.max_rdma_write_iov),
        ] {
            self.0[kind as usize].store(value, Ordering::Relaxed);
        }
    }
}

/// The INVALID_STATE subtype naming an EP state.
pub(crate) fn state_error(state: EpState) -> DatError {
    let sub = match state {
        EpState::Unconnected => SubType::EpUnconnected,
        EpState::UnconfiguredUnconnected => SubType::EpUnconfigured,
        EpState::Reserved => SubType::EpReserved,
        EpState::UnconfiguredReserved => SubType::EpUnconfReserved,
        EpState::PassiveConnectionPending => SubType::EpPassConnPending,
        EpState::UnconfiguredPassive => SubType::EpUnconfPassive,
        EpState::ActiveConnectionPending => SubType::EpActConnPending,
        EpState::TentativeConnectionPending => SubType::EpTentConnPending,
        EpState::UnconfiguredTentative => SubType::EpUnconfTentative,
        EpState::Connected => SubType::EpConnected,
        EpState::DisconnectPending => SubType::EpDiscPending,
        EpState::Disconnected => SubType::EpDisconnected,
        EpState::CompletionPending => SubType::EpComplPending,
    };
    DatError::invalid_state(sub)
}

fn acquire_evd(evd: &Option<Arc<Evd>>, bad: SubType) -> DatResult<()> {
    if let Some(e) = evd {
        if !e.users.acquire() {
            return Err(DatError::invalid_handle(bad));
        }
    }
    Ok(())
}

fn release_evd(evd: &Option<Arc<Evd>>) {
    if let Some(e) = evd {
        e.users.release();
    }
}

/// Checks that an EVD given for a role has the flag that role needs.
fn check_evd_role(evd: &Option<Arc<Evd>>, flag: u32, bad: SubType) -> DatResult<()> {
    match evd {
        Some(e) if e.flags() & flag == 0 => Err(DatError::invalid_handle(bad)),
        _ => Ok(()),
    }
}

/// The TCP port a conn_qual means. DAT conn_quals are 64-bit; those above
/// 65535 are folded into 33534..=65534 exactly as OFED's rdma_cm provider
/// folds them, so both agree on where a large conn_qual listens (dapltest's
/// limit test uses 0xAffab1e + n). Zero is no port.
pub fn port_of_conn_qual(conn_qual: u64) -> Option<u16> {
    const MODULUS: u64 = 32001;
    const BASE: u64 = 65535 - MODULUS;
    match conn_qual {
        0 => None,
        1..=0xffff => Some(conn_qual as u16),
        _ => Some((conn_qual % MODULUS + BASE) as u16),
    }
}

impl Evd {
    /// dat_evd_wait: waits until `threshold` events are queued with a notification event among
    /// them (see `evd`'s module rules) or `timeout_us` passes, then returns the first event and
    /// how many remain. A threshold above 1 on an EVD a consumer-controlled DTO stream feeds is
    /// DAT_INVALID_STATE. Here, not in evd.rs, because the EPs that feed the EVD tell that.
    pub fn wait(&self, timeout_us: u32, threshold: i32) -> DatResult<(Event, usize)> {
        let mut ev = None;
        let more = self.wait_into(timeout_us, threshold, &mut ev)?;
        Ok((ev.ok_or_else(DatError::internal)?, more))
    }

    /// `wait`, the event written to `out` (empty on entry) as in `dequeue_into`; returns how
    /// many events remain.
    pub fn wait_into(
        &self,
        timeout_us: u32,
        threshold: i32,
        out: &mut impl EventSlot,
    ) -> DatResult<usize> {
        self.wait_with(timeout_us, threshold, out, || consumer_controlled(self))
    }
}

/// Which consumer-controlled notification mode, if any, a DTO stream feeding `evd` uses: the
/// INVALID_STATE subtype a wait with a threshold above 1 gets. Called without the EVD's state
/// lock (it takes EP locks).
fn consumer_controlled(evd: &Evd) -> Option<SubType> {
    for (_, kind, object) in handle_table::children(evd.ia().handle()) {
        if kind != HandleKind::Ep {
            continue;
        }
        let Ok(ep) = object.downcast::<Ep>() else {
            continue;
        };
        let p = ep.query();
        let recv = p.attr.recv_completion_flags;
        let request = p.attr.request_completion_flags;
        if p.recv_evd == evd.handle() && recv & completion_flags::SOLICITED_WAIT != 0 {
            return Some(SubType::EvdConfigSolicited);
        }
        if (p.recv_evd == evd.handle() && recv & completion_flags::UNSIGNALLED != 0)
            || (p.request_evd == evd.handle() && request & completion_flags::UNSIGNALLED != 0)
        {
            return Some(SubType::EvdConfigNotify);
        }
    }
    None
}

impl Ep {
    /// dat_ep_create (srq None) and dat_ep_create_with_srq.
    pub fn create(
        ia: &Arc<Ia>,
        pz: Option<Arc<Pz>>,
        recv_evd: Option<Arc<Evd>>,
        request_evd: Option<Arc<Evd>>,
        connect_evd: Option<Arc<Evd>>,
        srq: Option<Arc<Srq>>,
        attr: Option<EpAttr>,
    ) -> DatResult<Arc<Ep>> {
        ia.check_open()?;
        let dev = ia.device().attr();
        let attr = match attr {
            Some(a) => {
                a.validate(&dev, Param::EpAttributes)?;
                a.with_defaults_for_zero(&dev)
            }
            None => EpAttr::defaults(&dev),
        };
        // Datagram EPs take their receives from their own queue (no SRQ).
        if srq.is_some() && attr.service_type == super::consts::ib_ext::SERVICE_TYPE_UD {
            return Err(DatError::bad(Param::EpAttributes));
        }
        check_evd_role(&recv_evd, evd_flags::DTO, SubType::InvalidHandleEvdRecv)?;
        check_evd_role(
            &request_evd,
            evd_flags::DTO | evd_flags::RMR_BIND,
            SubType::InvalidHandleEvdRequest,
        )?;
        check_evd_role(
            &connect_evd,
            evd_flags::CONNECTION,
            SubType::InvalidHandleEvdConn,
        )?;
        // DTO EVDs are fed by the device's completion queues, so they must
        // belong to this IA. A connection EVD is a software queue: OFED's
        // provider lets EPs of several IAs share one, and dapltest's limit
        // test does exactly that, so it may come from another IA.
        for (e, bad) in [
            (&recv_evd, SubType::InvalidHandleEvdRecv),
            (&request_evd, SubType::InvalidHandleEvdRequest),
        ] {
            if let Some(e) = e {
                if !Arc::ptr_eq(e.ia(), ia) {
                    return Err(DatError::invalid_handle(bad));
                }
            }
        }
        if let Some(p) = &pz {
            if !Arc::ptr_eq(p.ia(), ia) {
                return Err(HandleKind::Pz.invalid());
            }
        }

        ia.check_room(HandleKind::Ep, dev.max_qp, SubType::ResourceTep)?;

        // Take every use before building anything, undoing on failure.
        let mut taken: Vec<Box<dyn FnOnce()>> = Vec::new();
        let undo = |taken: Vec<Box<dyn FnOnce()>>| {
            for f in taken {
                f();
            }
        };
        if let Some(p) = &pz {
            p.acquire()?;
            let p = p.clone();
            taken.push(Box::new(move || p.users.release()));
        }
        for (e, bad) in [
            (&recv_evd, SubType::InvalidHandleEvdRecv),
            (&request_evd, SubType::InvalidHandleEvdRequest),
            (&connect_evd, SubType::InvalidHandleEvdConn),
        ] {
            if let Err(err) = acquire_evd(e, bad) {
                undo(taken);
                return Err(err);
            }
            let e = e.clone();
            taken.push(Box::new(move || release_evd(&e)));
        }
        if let Some(s) = &srq {
            if !s.users.acquire() {
                undo(taken);
                return Err(HandleKind::Srq.invalid());
            }
            let s = s.clone();
            taken.push(Box::new(move || s.users.release()));
        }

        let (qp, sink_cq) = match &pz {
            Some(p) => match build_qp(ia, p, &recv_evd, &request_evd, &srq, &attr, Param::IaHandle)
            {
                Ok((qp, sink)) => (Some(qp), sink),
                Err(e) => {
                    undo(taken);
                    return Err(e);
                }
            },
            None => (None, None),
        };
        let state = if pz.is_some() {
            EpState::Unconnected
        } else {
            EpState::UnconfiguredUnconnected
        };
        let reservation = ia.reserve(HandleKind::Ep);
        let ep = Arc::new(Ep {
            handle: reservation.handle(),
            ia: ia.clone(),
            shared: Arc::new(EpShared::new(
                reservation.handle(),
                attr.recv_completion_flags,
            )),
            iov_limits: IovLimits::of(&attr),
            carried_seq: AtomicU64::new(0),
            ud: Mutex::new(ud::UdTables::default()),
            inner: Mutex::new(EpInner {
                state,
                pz,
                recv_evd,
                request_evd,
                connect_evd,
                srq,
                attr,
                qp: qp.clone(),
                sink_cq,
                remote: None,
                peer_private_data: Arc::from(Vec::new()),
                watermarks: Watermarks::default(),
                reserved_by: Handle::NULL,
                freed: false,
            }),
        });
        if let Some(qp) = &qp {
            ia.eps_by_qp.lock().insert(qp.qp_num(), ep.qp_owner());
        }
        ia.commit(reservation, &ep);
        Ok(ep)
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }
    pub fn ia(&self) -> &Arc<Ia> {
        &self.ia
    }
    pub fn state(&self) -> EpState {
        self.inner.lock().state
    }
    pub fn attr(&self) -> EpAttr {
        self.inner.lock().attr
    }
    /// One IOV limit of the EP's attributes, without its lock: the C layer's bound on the
    /// triplets a post reads. The post checks the count again under the lock it takes anyway
    /// (a dat_ep_modify between the two is seen there).
    #[inline]
    pub fn iov_limit(&self, kind: IovKind) -> u32 {
        self.iov_limits.0[kind as usize].load(Ordering::Relaxed)
    }
    /// What the IA keeps of the EP by its QP's number.
    fn qp_owner(self: &Arc<Self>) -> QpOwner {
        QpOwner {
            shared: Arc::downgrade(&self.shared),
            ep: Arc::downgrade(self) as Weak<AnyObject>,
        }
    }
    /// The private data of the peer's request or accept; stays valid while the EP lives.
    pub fn peer_private_data(&self) -> Arc<[u8]> {
        self.inner.lock().peer_private_data.clone()
    }

    pub(crate) fn pz_or_err(&self) -> DatResult<Arc<Pz>> {
        self.inner
            .lock()
            .pz
            .clone()
            .ok_or(DatError::invalid_state(SubType::EpUnconfigured))
    }

    pub(crate) fn qp(&self) -> Option<Arc<dyn QueuePair>> {
        self.inner.lock().qp.clone()
    }

    /// dat_ep_query.
    pub fn query(&self) -> EpParam {
        let i = self.inner.lock();
        let local = i.qp.as_ref().and_then(|q| q.local_addr());
        EpParam {
            ia: self.ia.handle(),
            state: i.state,
            local_address: self.ia.address(),
            local_port: local.map(|a| u64::from(a.port())).unwrap_or(0),
            remote_address: i.remote.map(|a| *a.ip()),
            remote_port: i.remote.map(|a| u64::from(a.port())).unwrap_or(0),
            pz: i.pz.as_ref().map(|p| p.handle()).unwrap_or(Handle::NULL),
            recv_evd: i
                .recv_evd
                .as_ref()
                .map(|e| e.handle())
                .unwrap_or(Handle::NULL),
            request_evd: i
                .request_evd
                .as_ref()
                .map(|e| e.handle())
                .unwrap_or(Handle::NULL),
            connect_evd: i
                .connect_evd
                .as_ref()
                .map(|e| e.handle())
                .unwrap_or(Handle::NULL),
            srq: i.srq.as_ref().map(|s| s.handle()).unwrap_or(Handle::NULL),
            attr: i.attr,
        }
    }

    /// dat_ep_get_status: (state, recv_idle, request_idle).
    pub fn get_status(&self) -> (EpState, bool, bool) {
        let i = self.inner.lock();
        let recv_idle = i.qp.as_ref().map(|q| q.posted_recvs() == 0).unwrap_or(true);
        (i.state, recv_idle, true)
    }

    /// dat_ep_modify: only while not connected (UNCONNECTED or an UNCONFIGURED state).
    pub fn modify(self: &Arc<Self>, change: EpModify) -> DatResult<()> {
        let mut i = self.inner.lock();
        match i.state {
            EpState::Unconnected
            | EpState::UnconfiguredUnconnected
            | EpState::UnconfiguredReserved
            | EpState::UnconfiguredPassive
            | EpState::UnconfiguredTentative => {}
            s => return Err(state_error(s)),
        }
        let dev = self.ia.device().attr();
        if let Some(a) = &change.attr {
            a.validate(&dev, Param::EpParam)?;
        }
        if let Some(Some(e)) = &change.recv_evd {
            check_evd_role(
                &Some(e.clone()),
                evd_flags::DTO,
                SubType::InvalidHandleEvdRecv,
            )?;
        }
        if let Some(Some(e)) = &change.request_evd {
            check_evd_role(
                &Some(e.clone()),
                evd_flags::DTO | evd_flags::RMR_BIND,
                SubType::InvalidHandleEvdRequest,
            )?;
        }
        if let Some(Some(e)) = &change.connect_evd {
            check_evd_role(
                &Some(e.clone()),
                evd_flags::CONNECTION,
                SubType::InvalidHandleEvdConn,
            )?;
        }
        let pz = change.pz.clone().or_else(|| i.pz.clone());
        let recv_evd = change
            .recv_evd
            .clone()
            .unwrap_or_else(|| i.recv_evd.clone());
        let request_evd = change
            .request_evd
            .clone()
            .unwrap_or_else(|| i.request_evd.clone());
        let connect_evd = change
            .connect_evd
            .clone()
            .unwrap_or_else(|| i.connect_evd.clone());
        let attr = change.attr.unwrap_or(i.attr);

        // Acquire the new uses first so a failure leaves the EP unchanged.
        if let Some(p) = &change.pz {
            p.acquire()?;
        }
        let mut acquired: Vec<Arc<Evd>> = Vec::new();
        for (new, bad) in [
            (&change.recv_evd, SubType::InvalidHandleEvdRecv),
            (&change.request_evd, SubType::InvalidHandleEvdRequest),
            (&change.connect_evd, SubType::InvalidHandleEvdConn),
        ] {
            if let Some(Some(e)) = new {
                if !e.users.acquire() {
                    for a in &acquired {
                        a.users.release();
                    }
                    if let Some(p) = &change.pz {
                        p.users.release();
                    }
                    return Err(DatError::invalid_handle(bad));
                }
                acquired.push(e.clone());
            }
        }
        let rebuilt = match &pz {
            Some(p) => match build_qp(
                &self.ia,
                p,
                &recv_evd,
                &request_evd,
                &i.srq,
                &attr,
                Param::EpHandle,
            ) {
                Ok(x) => Some(x),
                Err(e) => {
                    for a in &acquired {
                        a.users.release();
                    }
                    if let Some(p) = &change.pz {
                        p.users.release();
                    }
                    return Err(e);
                }
            },
            None => None,
        };
        // Commit: release the old uses that were replaced.
        if change.pz.is_some() {
            if let Some(old) = i.pz.take() {
                old.users.release();
            }
        }
        if change.recv_evd.is_some() {
            release_evd(&i.recv_evd);
        }
        if change.request_evd.is_some() {
            release_evd(&i.request_evd);
        }
        if change.connect_evd.is_some() {
            release_evd(&i.connect_evd);
        }
        if let Some(old) = i.qp.take() {
            self.ia.eps_by_qp.lock().remove(&old.qp_num());
            old.destroy();
        }
        i.pz = pz;
        i.recv_evd = recv_evd;
        i.request_evd = request_evd;
        i.connect_evd = connect_evd;
        i.attr = attr;
        self.iov_limits.set(&attr);
        self.shared
            .set_recv_completion_flags(attr.recv_completion_flags);
        if let Some((qp, sink)) = rebuilt {
            self.ia
                .eps_by_qp
                .lock()
                .insert(qp.qp_num(), self.qp_owner());
            i.qp = Some(qp);
            i.sink_cq = sink;
            if i.state == EpState::UnconfiguredUnconnected {
                i.state = EpState::Unconnected;
            }
            // A provider-created EP configured by its consumer can now be accepted on.
            if i.state == EpState::UnconfiguredTentative {
                i.state = EpState::TentativeConnectionPending;
            }
        }
        Ok(())
    }

    // ---- connection management ---------------------------------------------------------------

    /// dat_ep_connect.
    pub fn connect(
        &self,
        remote: Ipv4Addr,
        conn_qual: u64,
        timeout_us: u32,
        private_data: &[u8],
        _qos: u32,
        flags: u32,
    ) -> DatResult<()> {
        self.ia.check_open()?;
        let port = port_of_conn_qual(conn_qual).ok_or(DatError::bad(Param::RemoteConnQual))?;
        if private_data.len() > self.ia.device().attr().max_private_data as usize {
            return Err(DatError::bad(Param::PrivateDataSize));
        }
        if flags > 1 {
            return Err(DatError::bad(Param::ConnectFlags));
        }
        self.connect_to(SocketAddrV4::new(remote, port), timeout_us, private_data)
    }

    /// dat_ep_common_connect: connects to the service point at `remote`, address and port (a
    /// peer's CSP, or any service point listening on that port); there is no conn_qual, no
    /// qos and no flags. A remote port of 0 names no service point: DAT_INVALID_ADDRESS
    /// (DAT_INVALID_ADDRESS_MALFORMED).
    pub fn common_connect(
        &self,
        remote: SocketAddrV4,
        timeout_us: u32,
        private_data: &[u8],
    ) -> DatResult<()> {
        self.ia.check_open()?;
        if remote.port() == 0 {
            return Err(DatError::new(
                ErrorType::InvalidAddress,
                SubType::InvalidAddressMalformed,
            ));
        }
        if private_data.len() > self.ia.device().attr().max_private_data as usize {
            return Err(DatError::bad(Param::PrivateDataSize));
        }
        self.connect_to(remote, timeout_us, private_data)
    }

    /// The active side of a connection, once the arguments are checked: UNCONNECTED ->
    /// ACTIVE_CONNECTION_PENDING, and the backend's connect.
    fn connect_to(
        &self,
        remote: SocketAddrV4,
        timeout_us: u32,
        private_data: &[u8],
    ) -> DatResult<()> {
        if self.is_ud() {
            return self.ud_connect(remote, timeout_us, private_data);
        }
        let qp = {
            let mut i = self.inner.lock();
            if i.state != EpState::Unconnected {
                return Err(state_error(i.state));
            }
            if i.connect_evd.is_none() {
                return Err(DatError::invalid_handle(SubType::InvalidHandleEvdConn));
            }
            let qp =
                i.qp.clone()
                    .ok_or(DatError::invalid_state(SubType::EpUnconfigured))?;
            i.state = EpState::ActiveConnectionPending;
            i.remote = Some(remote);
            qp
        };
        let timeout = if timeout_us == super::consts::TIMEOUT_INFINITE {
            None
        } else {
            Some(Duration::from_micros(u64::from(timeout_us)))
        };
        let result = self.ia.device().connect(&qp, remote, private_data, timeout);
        if let Err(e) = result {
            let mut i = self.inner.lock();
            if i.state == EpState::ActiveConnectionPending {
                i.state = EpState::Unconnected;
                i.remote = None;
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// dat_ep_dup_connect: connects to the peer `dup` is connected to.
    pub fn dup_connect(
        &self,
        dup: &Arc<Ep>,
        timeout_us: u32,
        private_data: &[u8],
        qos: u32,
    ) -> DatResult<()> {
        let remote = {
            let d = dup.inner.lock();
            if d.state != EpState::Connected {
                return Err(state_error(d.state));
            }
            d.remote
                .ok_or(DatError::invalid_state(SubType::EpUnconnected))?
        };
        self.connect(
            *remote.ip(),
            u64::from(remote.port()),
            timeout_us,
            private_data,
            qos,
            0,
        )
    }

    /// dat_ep_disconnect. Completion is the DISCONNECTED event on the connect EVD.
    pub fn disconnect(&self, flags: u32) -> DatResult<()> {
        if flags > 1 {
            return Err(DatError::bad(Param::CloseFlags));
        }
        let abrupt = flags == super::consts::close_flags::ABRUPT;
        let qp = {
            let mut i = self.inner.lock();
            match i.state {
                EpState::Disconnected => return Ok(()),
                EpState::Connected
                | EpState::ActiveConnectionPending
                | EpState::PassiveConnectionPending
                | EpState::DisconnectPending => {}
                s => return Err(state_error(s)),
            }
            i.state = EpState::DisconnectPending;
            i.qp.clone()
        };
        match qp {
            Some(qp) => Ok(self.ia.device().disconnect(&qp, abrupt)?),
            None => Ok(()),
        }
    }

    /// dat_ep_reset: DISCONNECTED (or UNCONNECTED) -> UNCONNECTED with empty queues.
    pub fn reset(self: &Arc<Self>) -> DatResult<()> {
        let qp = {
            let i = self.inner.lock();
            match i.state {
                EpState::Disconnected | EpState::Unconnected => {}
                s => return Err(state_error(s)),
            }
            i.qp.clone()
        };
        if let Some(qp) = &qp {
            qp.reset()?;
        }
        let mut i = self.inner.lock();
        // A QP the device cannot connect again (siw's never leaves ERROR): a new one, as
        // dat_ep_modify makes, with the same PZ, EVDs, SRQ and attributes.
        if let Some(old) = qp.filter(|q| q.replaced_after_reset()) {
            if let Some(pz) = i.pz.clone() {
                let (new, sink) = build_qp(
                    &self.ia,
                    &pz,
                    &i.recv_evd,
                    &i.request_evd,
                    &i.srq,
                    &i.attr,
                    Param::EpHandle,
                )?;
                self.ia.eps_by_qp.lock().remove(&old.qp_num());
                old.destroy();
                self.ia
                    .eps_by_qp
                    .lock()
                    .insert(new.qp_num(), self.qp_owner());
                i.qp = Some(new);
                i.sink_cq = sink;
            }
        }
        i.state = EpState::Unconnected;
        i.remote = None;
        i.peer_private_data = Arc::from(Vec::new());
        Ok(())
    }

    /// Called by an RSP: UNCONNECTED -> RESERVED.
    pub(crate) fn reserve_for(&self, sp: Handle) -> DatResult<()> {
        let mut i = self.inner.lock();
        if i.state != EpState::Unconnected {
            return Err(state_error(i.state));
        }
        i.state = EpState::Reserved;
        i.reserved_by = sp;
        Ok(())
    }

    /// Called when an RSP goes away or a tentative request is rejected.
    pub(crate) fn unreserve(&self, sp: Handle) {
        let mut i = self.inner.lock();
        if i.reserved_by == sp
            && matches!(
                i.state,
                EpState::Reserved | EpState::TentativeConnectionPending
            )
        {
            i.state = EpState::Unconnected;
            i.reserved_by = Handle::NULL;
        }
    }

    /// A request arrived on this EP's RSP: RESERVED -> TENTATIVE_CONNECTION_PENDING.
    /// A PSP with DAT_PSP_PROVIDER_FLAG created this EP (no PZ yet) for a request:
    /// UNCONFIGURED_UNCONNECTED -> UNCONFIGURED_TENTATIVE.
    pub(crate) fn make_provider_tentative(&self, private_data: &[u8]) {
        let mut i = self.inner.lock();
        if i.state == EpState::UnconfiguredUnconnected {
            i.state = EpState::UnconfiguredTentative;
            i.peer_private_data = Arc::from(private_data.to_vec());
        }
    }

    pub(crate) fn make_tentative(&self, private_data: &[u8]) -> bool {
        let mut i = self.inner.lock();
        if i.state != EpState::Reserved {
            return false;
        }
        i.state = EpState::TentativeConnectionPending;
        i.peer_private_data = Arc::from(private_data.to_vec());
        true
    }

    /// dat_cr_accept's part on the EP: -> PASSIVE_CONNECTION_PENDING, returns the QP to accept on.
    pub(crate) fn begin_accept(
        &self,
        remote: SocketAddrV4,
        private_data: &[u8],
    ) -> DatResult<Arc<dyn QueuePair>> {
        let mut i = self.inner.lock();
        match i.state {
            EpState::Unconnected | EpState::TentativeConnectionPending => {}
            s => return Err(state_error(s)),
        }
        if i.connect_evd.is_none() {
            return Err(DatError::invalid_handle(SubType::InvalidHandleEvdConn));
        }
        let qp =
            i.qp.clone()
                .ok_or(DatError::invalid_state(SubType::EpUnconfigured))?;
        i.state = EpState::PassiveConnectionPending;
        i.remote = Some(remote);
        i.peer_private_data = Arc::from(private_data.to_vec());
        i.reserved_by = Handle::NULL;
        Ok(qp)
    }

    /// An accept failed synchronously.
    pub(crate) fn abort_accept(&self) {
        let mut i = self.inner.lock();
        if i.state == EpState::PassiveConnectionPending {
            i.state = EpState::Unconnected;
            i.remote = None;
        }
    }

    fn post_connection_event(&self, evd: Option<Arc<Evd>>, number: u32, pd: Arc<[u8]>) {
        if let Some(evd) = evd {
            evd.push_provider(Event {
                number,
                evd: evd.handle(),
                data: EventData::Connection {
                    ep: self.handle,
                    private_data: pd,
                },
            });
        }
    }

    pub(crate) fn on_established(&self, private_data: Vec<u8>) {
        let (evd, pd) = {
            let mut i = self.inner.lock();
            match i.state {
                EpState::ActiveConnectionPending => {
                    i.peer_private_data = Arc::from(private_data);
                }
                EpState::PassiveConnectionPending => {}
                _ => return,
            }
            i.state = EpState::Connected;
            (i.connect_evd.clone(), i.peer_private_data.clone())
        };
        self.post_connection_event(evd, event_number::CONNECTION_ESTABLISHED, pd);
        // A hard high watermark applies from the moment the connection is established.
        self.check_recv_watermarks();
    }

    /// The connection (or its establishment) ended: DISCONNECTED, and the connection event.
    ///
    /// An EP using an SRQ also reports DAT_ASYNC_ERROR_EP_BROKEN (reason
    /// DAT_EP_TRANSFER_TO_ERROR) on the IA's async EVD: it takes no more receives from the SRQ,
    /// so the consumer may account for the SRQ's buffers. This is verbs' "last WQE reached"
    /// event of a QP attached to an SRQ entering the error state, which OFED's provider reports
    /// this way for every disconnection and which consumers written for it (dtestsrq) wait
    /// for. It is queued before the connection event, so a consumer that has seen the one can
    /// dequeue the other.
    pub(crate) fn on_connection_lost(&self, number: u32, private_data: Vec<u8>) {
        let (evd, pd, has_srq) = {
            let mut i = self.inner.lock();
            match i.state {
                EpState::ActiveConnectionPending
                | EpState::PassiveConnectionPending
                | EpState::TentativeConnectionPending
                | EpState::Connected
                | EpState::DisconnectPending => {}
                _ => return,
            }
            let number = if i.state == EpState::PassiveConnectionPending
                && number != event_number::CONNECTION_DISCONNECTED
            {
                event_number::CONNECTION_ACCEPT_COMPLETION_ERROR
            } else if std::mem::take(&mut i.watermarks.breaking) {
                // We tore the connection down: its hard high watermark was exceeded.
                event_number::CONNECTION_BROKEN
            } else {
                number
            };
            i.state = EpState::Disconnected;
            if !private_data.is_empty() {
                i.peer_private_data = Arc::from(private_data);
            }
            (
                i.connect_evd.clone().map(|e| (e, number)),
                i.peer_private_data.clone(),
                i.srq.is_some(),
            )
        };
        if has_srq {
            self.ia.post_async_reason(
                event_number::ASYNC_EP_BROKEN,
                self.handle,
                async_reason::EP_TRANSFER_TO_ERROR,
            );
        }
        if let Some((evd, number)) = evd {
            self.post_connection_event(Some(evd), number, pd);
        }
    }

    /// dat_ep_free: any state; a connection is torn down abruptly and outstanding requests are
    /// flushed.
    pub fn free(self: &Arc<Self>) -> DatResult<()> {
        self.ia.remove(self.handle, HandleKind::Ep)?;
        self.destroy();
        Ok(())
    }

    /// Tears the EP down. The EP lock is never held across backend calls: those deliver
    /// connection events synchronously, and the event path takes the EP lock.
    pub(crate) fn destroy(&self) {
        let (qp, was_connecting) = {
            let mut i = self.inner.lock();
            if i.freed {
                return;
            }
            i.freed = true;
            let was = matches!(
                i.state,
                EpState::Connected
                    | EpState::ActiveConnectionPending
                    | EpState::PassiveConnectionPending
                    | EpState::DisconnectPending
            );
            // A freed EP reports no more connection events.
            i.state = EpState::Disconnected;
            (i.qp.take(), was)
        };
        if let Some(qp) = qp {
            self.ia.eps_by_qp.lock().remove(&qp.qp_num());
            if was_connecting {
                let _ = self.ia.device().disconnect(&qp, true);
            }
            qp.destroy();
        }
        // Address handles go with their EP, before its PZ is released.
        self.ud.lock().clear();
        let mut i = self.inner.lock();
        // Deliver what the flush produced while the EVDs are still ours.
        for evd in [&i.request_evd, &i.recv_evd].into_iter().flatten() {
            evd.drain_cq();
        }
        if let Some(p) = i.pz.take() {
            p.users.release();
        }
        release_evd(&i.recv_evd);
        release_evd(&i.request_evd);
        release_evd(&i.connect_evd);
        if let Some(s) = i.srq.take() {
            s.users.release();
        }
    }
}

/// The private CQ standing in for a NULL EVD, if one was needed.
type SinkCq = Option<Arc<dyn CompletionQueue>>;

/// Creates the QP of an EP: CQs of its EVDs (or a private sink CQ for a missing one).
fn build_qp(
    ia: &Arc<Ia>,
    pz: &Arc<Pz>,
    recv_evd: &Option<Arc<Evd>>,
    request_evd: &Option<Arc<Evd>>,
    srq: &Option<Arc<Srq>>,
    attr: &EpAttr,
    owner: Param,
) -> DatResult<(Arc<dyn QueuePair>, SinkCq)> {
    let dev = ia.device();
    let mut sink: Option<Arc<dyn CompletionQueue>> = None;
    let mut cq_for = |evd: &Option<Arc<Evd>>| -> DatResult<Arc<dyn CompletionQueue>> {
        if let Some(cq) = evd.as_ref().and_then(|e| e.cq().cloned()) {
            return Ok(cq);
        }
        if let Some(s) = &sink {
            return Ok(s.clone());
        }
        let s = dev.create_cq(attr.max_request_dtos.max(attr.max_recv_dtos).max(1))?;
        // Nobody waits on a sink: drop its completions and their tracking entries as they come.
        let weak_ia = Arc::downgrade(ia);
        let weak_cq = Arc::downgrade(&s);
        s.set_notify(Some(Arc::new(move || {
            let (Some(ia), Some(cq)) = (weak_ia.upgrade(), weak_cq.upgrade()) else {
                return;
            };
            let mut batch = Vec::new();
            while cq.poll(64, &mut batch) > 0 {
                for wc in batch.drain(..) {
                    completion::retire(&ia, &wc);
                }
            }
        })));
        sink = Some(s.clone());
        Ok(s)
    };
    let send_cq = cq_for(request_evd)?;
    let recv_cq = cq_for(recv_evd)?;
    let init = QpInit {
        pd: pz.pd().clone(),
        send_cq,
        recv_cq,
        srq: srq.as_ref().map(|s| s.backend().clone()),
        cap: QpCap {
            max_send_wr: attr.max_request_dtos.max(1),
            max_recv_wr: attr.max_recv_dtos,
            max_send_sge: attr
                .max_request_iov
                .max(attr.max_rdma_read_iov)
                .max(attr.max_rdma_write_iov),
            max_recv_sge: attr.max_recv_iov,
            max_rd_atomic: attr.max_rdma_read_out,
            max_inline: 0,
        },
    };
    let qp = if attr.service_type == super::consts::ib_ext::SERVICE_TYPE_UD {
        dev.create_ud_qp(init)
    } else {
        dev.create_qp(init)
    };
    // A CQ or SRQ the device does not take is refused as `owner`'s (the IA or EP), as ever.
    let qp = qp.map_err(|e| from_backend(e, Some(owner)))?;
    Ok((qp, sink))
}
