//! The verbs-shaped transport interface the core is written against.
//!
//! The shapes follow ibverbs + rdma_cm on purpose (device, protection domain, memory region with
//! lkey/rkey, memory window, completion queue with a notify hook, queue pair with send/recv work
//! requests of (addr, len, lkey) scatter-gather lists, shared receive queue, connection manager
//! with listen/connect/accept/reject/disconnect and asynchronous events), so an ibverbs backend can
//! implement the same traits. The TCP backend (crate `daplrs-tcp`) is the software transport.
//!
//! Errors are `Error`s (`error`), in verbs and transport terms: the core maps them to DAT codes.
//! The factory that opens a device of either backend from an IA's ia_params is `daplrs::device`.
//! This crate names no DAT type: the backends depend on it alone, the core on it and on no
//! backend.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod arena;
pub mod clock;
pub mod error;
pub mod guarded;
pub mod intmap;
pub mod mapping;
pub mod memfile;
pub mod netif;
pub mod peer_fd;
pub mod shared_map;

use std::any::Any;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use error::{Error, Resource, Result};

/// Memory access rights of a memory region or window (ibverbs IBV_ACCESS_* bit values).
pub mod access {
    pub const LOCAL_WRITE: u32 = 1;
    pub const REMOTE_WRITE: u32 = 2;
    pub const REMOTE_READ: u32 = 4;
    pub const REMOTE_ATOMIC: u32 = 8;
    pub const MW_BIND: u32 = 16;
}

/// Limits of a device, reported through dat_ia_query and used to validate attributes.
#[derive(Clone, Debug)]
pub struct DeviceAttr {
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_mr_size: u64,
    pub max_pd: u32,
    pub max_mw: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_msg_size: u32,
    pub max_rdma_size: u32,
    /// Outstanding RDMA reads per QP, as initiator and as target.
    pub max_rd_atomic: u32,
    pub max_private_data: u32,
    /// The largest payload the link under the device carries in one packet: an RDMA port's
    /// active MTU, the MTU of the interface a TCP device is bound to. Reported to consumers
    /// (DAT_IB_TRANSPORT_MTU), which size messages by it. A datagram carries at most this
    /// many bytes of payload.
    pub mtu: u32,
    /// The device provides unreliable datagram QPs (`Device::create_ud_qp`, `ud_resolve`,
    /// `ud_accept`, `QueuePair::post_send_ud`).
    pub ud: bool,
    /// Local segments of an RDMA read (the device's max_sge_rd: siw reads into one).
    pub max_rdma_read_sge: u32,
    /// 64-bit atomics (fetch-and-add, compare-and-swap): `SendOp::FetchAdd`/`CmpSwap`. iWARP
    /// devices mostly have none (siw: atomic_cap ATOMIC_NONE).
    pub atomics: bool,
    /// RDMA write with immediate data (`SendOp::WriteImm`); iWARP has no immediate data.
    pub write_imm: bool,
    /// A registration asking for write access pins the pages for writing, and fails with
    /// `Error::BadAddress` where any of them is not mapped writable (an RDMA device's
    /// ibv_reg_mr: EFAULT). The core then need not ask the kernel about that memory first.
    pub pins_for_write: bool,
    /// Registrations pin their pages against the process's locked-memory limit
    /// (RLIMIT_MEMLOCK) and fail beyond it: that limit in bytes. None where nothing is
    /// pinned against it (the limit is infinite, the process may lock any amount, or the
    /// backend pins nothing).
    pub pin_limit: Option<u64>,
    /// The transport under the device, as datinfo shows it: "TCP", "InfiniBand", "RoCE",
    /// "iWARP".
    pub transport: &'static str,
}

/// The most bytes a region of a process's memory can span: its address space, at most 2^56
/// bytes (x86-64 with 5-level paging). A device may state no bound (libfabric) or a bound
/// past it (rxe: 2^64 - 1); a longer region is the caller's error, not a lack of resources.
pub const MAX_REGION_BYTES: u64 = 1 << 56;

/// Bytes a datagram receive reserves before the payload: on InfiniBand and RoCE the Global
/// Route Header the NIC writes there (the receive's byte_len counts them); backends without
/// one write a GRH of their own (`software_grh`).
pub const GRH_LEN: u32 = 40;

/// The GRH area a software backend writes before a received datagram: an InfiniBand GRH (IP
/// version 6, payload length, next header 0x1B, hop limit 64) whose source and destination
/// GIDs are the IPv4-mapped addresses of the sending and the receiving IA, as RoCE GIDs of
/// IPv4 addresses are.
pub fn software_grh(
    src: std::net::Ipv4Addr,
    dst: std::net::Ipv4Addr,
    payload_len: usize,
) -> [u8; GRH_LEN as usize] {
    let mut g = [0u8; GRH_LEN as usize];
    g[0] = 0x60;
    g[4..6].copy_from_slice(&(payload_len.min(0xffff) as u16).to_be_bytes());
    g[6] = 0x1b;
    g[7] = 64;
    g[8..24].copy_from_slice(&src.to_ipv6_mapped().octets());
    g[24..40].copy_from_slice(&dst.to_ipv6_mapped().octets());
    g
}

/// One element of a scatter-gather list: the 2.0 LMR triplet, same layout as ibv_sge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// A scatter-gather list: up to `INLINE` segments with no heap allocation (a DTO's post
/// path allocates nothing for the lists programs use), more on the heap.
#[derive(Clone, Debug, Default)]
pub struct SgeList {
    len: usize,
    inline: [Sge; SgeList::INLINE],
    heap: Vec<Sge>,
}

impl SgeList {
    pub const INLINE: usize = 4;

    // `#[inline]` here and on the derefs: the core builds the list and the backend reads it
    // on every post, and without it each use is a call across crates.
    #[inline]
    pub fn new() -> SgeList {
        SgeList::default()
    }

    #[inline]
    pub fn push(&mut self, s: Sge) {
        if self.heap.is_empty() && self.len < Self::INLINE {
            self.inline[self.len] = s;
        } else {
            if self.heap.is_empty() {
                self.heap.extend_from_slice(&self.inline[..self.len]);
            }
            self.heap.push(s);
        }
        self.len += 1;
    }

    /// Keeps the first `n` segments.
    pub fn truncate(&mut self, n: usize) {
        if n < self.len {
            self.len = n;
            self.heap.truncate(n);
        }
    }
}

impl std::ops::Deref for SgeList {
    type Target = [Sge];
    #[inline]
    fn deref(&self) -> &[Sge] {
        match self.heap.is_empty() {
            true => &self.inline[..self.len],
            false => &self.heap,
        }
    }
}

impl std::ops::DerefMut for SgeList {
    #[inline]
    fn deref_mut(&mut self) -> &mut [Sge] {
        match self.heap.is_empty() {
            true => &mut self.inline[..self.len],
            false => &mut self.heap,
        }
    }
}

impl FromIterator<Sge> for SgeList {
    fn from_iter<I: IntoIterator<Item = Sge>>(iter: I) -> SgeList {
        let mut l = SgeList::new();
        for s in iter {
            l.push(s);
        }
        l
    }
}

impl From<Vec<Sge>> for SgeList {
    fn from(v: Vec<Sge>) -> SgeList {
        v.into_iter().collect()
    }
}

impl PartialEq for SgeList {
    fn eq(&self, other: &SgeList) -> bool {
        **self == **other
    }
}

#[derive(Clone)]
pub enum SendOp {
    Send,
    /// A send that, once its message is placed, invalidates the target's memory window whose
    /// current rkey is `rkey` (the receive completes with `invalidated`).
    SendInv {
        rkey: u32,
    },
    RdmaWrite {
        remote_addr: u64,
        rkey: u32,
    },
    RdmaRead {
        remote_addr: u64,
        rkey: u32,
    },
    /// An RDMA write that also consumes a receive at the target, which completes carrying
    /// `imm` (opcode `RecvRdmaImm`, byte_len = the write's length).
    RdmaWriteImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    /// 64-bit fetch-and-add on the target's naturally aligned word; the word's previous value
    /// lands in the 8-byte local segment.
    FetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
    /// 64-bit compare-and-swap on the target's naturally aligned word (`swap` is stored when
    /// the word equals `compare`); the word's previous value lands in the 8-byte local segment.
    CmpSwap {
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    /// Bind (or, with length 0, unbind) a memory window to a range of a memory region.
    /// The window's rkey becomes `new_rkey` once the bind completes in order.
    BindMw {
        mw: Arc<dyn MemoryWindow>,
        /// None unbinds.
        mr: Option<Arc<dyn MemoryRegion>>,
        addr: u64,
        length: u64,
        access: u32,
        /// The rkey the window carries once this bind executes (from `MemoryWindow::next_rkey`).
        new_rkey: u32,
    },
}

impl SendOp {
    /// The opcode of this request's completion.
    pub fn opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendInv { .. } => WcOpcode::Send,
            SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::RdmaWriteImm { .. } => WcOpcode::RdmaWriteImm,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::CmpSwap { .. } => WcOpcode::CmpSwap,
            SendOp::BindMw { .. } => WcOpcode::BindMw,
        }
    }
}

/// What the consumer keeps of a work request, handed to the backend with it and given back,
/// untouched, in its completion: the consumer's record of the request lives in the backend's
/// own record of it (a verbs QP's send or receive queue), not in a second table keyed by
/// wr_id. Opaque to the backend; `NONE` when the consumer keeps its own record (requests
/// whose record holds more than it, an SRQ's receives).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WrContext(pub [u64; 3]);

impl WrContext {
    pub const NONE: WrContext = WrContext([0; 3]);
}

#[derive(Clone)]
pub struct SendWr {
    pub wr_id: u64,
    /// Given back in every completion of the request, flushes included.
    pub ctx: WrContext,
    pub op: SendOp,
    pub sgl: SgeList,
    /// Whether the consumer waits for this request's success. Every request is reported
    /// (the core retires its tracking with the completion), but one that is not signaled may
    /// be reported late: the verbs backend posts it unsignaled and reports its success when
    /// a later request of the queue pair completes.
    pub signaled: bool,
    pub solicited: bool,
    /// Do not start until every earlier request on this QP has completed.
    pub fence: bool,
}

impl SendWr {
    /// Ends a request after its post: forgotten when it owns nothing to free (no window, a
    /// segment list that never left its inline array), else dropped. The out-of-line drop
    /// glue (the window's `Arc`, the list's heap) cost every post a call and 16 instructions.
    #[inline(always)]
    pub fn dispose(self) {
        if self.sgl.heap.capacity() == 0 && !matches!(self.op, SendOp::BindMw { .. }) {
            std::mem::forget(self);
        } else {
            drop(self);
        }
    }
}

pub struct RecvWr {
    pub wr_id: u64,
    /// Given back in every completion of the receive, flushes included.
    pub ctx: WrContext,
    pub sgl: SgeList,
}

impl RecvWr {
    /// The completion of this receive (see `WorkCompletion::new`), carrying its context.
    #[inline]
    pub fn completion(
        &self,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        qp_num: u32,
    ) -> WorkCompletion {
        WorkCompletion::new(self.wr_id, status, opcode, byte_len, qp_num).with_ctx(self.ctx)
    }

    /// This receive, flushed.
    pub fn flushed(&self, qp_num: u32) -> WorkCompletion {
        WorkCompletion::flushed(self.wr_id, WcOpcode::Recv, qp_num).with_ctx(self.ctx)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    Recv,
    BindMw,
    RdmaWriteImm,
    FetchAdd,
    CmpSwap,
    /// A receive consumed by the peer's RDMA write with immediate data.
    RecvRdmaImm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    LocalLength,
    LocalQpOp,
    LocalProtection,
    Flushed,
    MwBind,
    BadResponse,
    RemoteAccess,
    RemoteInvalidRequest,
    RemoteOp,
    Transport,
    ReceiverNotReady,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    /// The request's `SendWr::ctx` (`NONE` for a receive).
    pub ctx: WrContext,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    pub qp_num: u32,
    /// For a BindMw completion, the rkey the window now carries.
    pub new_rkey: u32,
    /// For a RecvRdmaImm completion, the immediate data.
    pub imm: Option<u32>,
    /// For a receive of a send-with-invalidate, the rkey of ours it invalidated.
    pub invalidated: Option<u32>,
    /// For a receive, whether the peer's send asked for solicited notification. A backend
    /// that cannot see it (verbs: an ibv_wc has no such bit) says true for every receive.
    pub solicited: bool,
}

impl WorkCompletion {
    /// The completion of request or receive `wr_id` on `qp_num` with `status`; `byte_len`
    /// counts only if it succeeded. No immediate data, invalidation or solicited bit (set them
    /// with struct update syntax where the operation has them).
    pub fn new(
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        qp_num: u32,
    ) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            ctx: WrContext::NONE,
            status,
            opcode,
            byte_len: if status == WcStatus::Success {
                byte_len
            } else {
                0
            },
            qp_num,
            new_rkey: 0,
            imm: None,
            invalidated: None,
            solicited: false,
        }
    }

    /// A request or receive that did not execute: the QP left the connected state.
    pub fn flushed(wr_id: u64, opcode: WcOpcode, qp_num: u32) -> WorkCompletion {
        WorkCompletion::new(wr_id, WcStatus::Flushed, opcode, 0, qp_num)
    }

    /// The same completion, carrying the request's context.
    #[inline]
    pub fn with_ctx(self, ctx: WrContext) -> WorkCompletion {
        WorkCompletion { ctx, ..self }
    }
}

/// Called by a backend (from any thread, holding none of its own locks) after it added
/// completions to a CQ, so the consumer of the CQ can poll it.
pub type NotifyFn = Arc<dyn Fn() + Send + Sync>;

pub trait CompletionQueue: Send + Sync {
    /// The backend's own object behind the trait (a backend reaches its native handles through
    /// it when the core hands one of its objects back, e.g. the PD and CQs of `QpInit`).
    fn as_any(&self) -> &dyn Any;
    /// Unique within the device that created it (lets a backend find its own concrete CQ).
    fn id(&self) -> u64;
    /// Moves up to `max` completions into `out`; returns how many.
    fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize;
    /// Installs (or removes) the notification hook.
    fn set_notify(&self, notify: Option<NotifyFn>);
    /// Whether completions must reach the notification hook by themselves, with nobody
    /// polling or driving the CQ (its EVD feeds a CNO). Where they need not, a backend may
    /// call the hook only from `drive` and `poll` (verbs: no completion event is asked for).
    fn set_events_wanted(&self, wanted: bool) {
        let _ = wanted;
    }
    fn resize(&self, depth: u32) -> Result<()>;
    fn depth(&self) -> u32;
    /// Waits, until `deadline` at the latest, for traffic on the connections whose completions
    /// this CQ receives and handles it on the calling thread: the thread waiting for a
    /// completion is then the one woken when it arrives, instead of a progress thread that
    /// would then have to wake it (one thread wake-up less per round trip). Returns false at
    /// once when the backend cannot do that for this CQ now (the caller waits its own way);
    /// true after it waited (completions may have been added, `interrupt` may have been
    /// called, or a deadline or the backend's own bound passed). The caller drains this CQ
    /// when it returns: what the drive found here need not go through the notification hook.
    fn drive(&self, deadline: Option<Instant>) -> bool {
        let _ = deadline;
        false
    }
    /// The thread that called `drive` (once or many times) stops waiting: what it kept from
    /// the backend's own threads between its drives goes back to them.
    fn end_drive(&self) {}
    /// Makes a `drive` in progress on another thread return soon.
    fn interrupt(&self) {}
    /// Moves the transport forward on the calling thread without blocking: a polling consumer
    /// found its EVD empty and is about to look again. A backend whose completions need a
    /// thread to read them (TCP) reads this CQ's connections here, so that the completion a
    /// poller spins for does not wait for a progress thread to get a CPU and hand it over.
    /// Returns whether it looked at anything (completions may have been added).
    fn progress(&self) -> bool {
        false
    }
}

pub trait ProtectionDomain: Send + Sync {
    /// The backend's own object behind the trait (a backend reaches its native handles through
    /// it when the core hands one of its objects back, e.g. the PD and CQs of `QpInit`).
    fn as_any(&self) -> &dyn Any;
    fn id(&self) -> u32;
    /// Registers [addr, addr+length) of this process's memory. The caller guarantees the range
    /// stays valid memory until `MemoryRegion::deregister` returns.
    fn reg_mr(&self, addr: u64, length: u64, access: u32) -> Result<Arc<dyn MemoryRegion>>;
    fn alloc_mw(&self) -> Result<Arc<dyn MemoryWindow>>;
}

/// What a registration is, as its backend made it: the one value each backend keeps for the
/// core to read (the accessors of `MemoryRegion`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Registration {
    pub lkey: u32,
    /// What a peer names the region by (verbs may hand out another than the device's when the
    /// region grants no remote right: backend-verbs/src/mem.rs).
    pub rkey: u32,
    pub addr: u64,
    pub length: u64,
    /// The `access` flags the registration grants.
    pub access: u32,
    /// The protection domain's id (`ProtectionDomain::id`).
    pub pd_id: u32,
}

pub trait MemoryRegion: Send + Sync {
    /// The backend's own object behind the trait (a backend reaches its native handles through
    /// it when the core hands one of its objects back, e.g. the PD and CQs of `QpInit`).
    fn as_any(&self) -> &dyn Any;
    /// What was registered.
    fn registration(&self) -> &Registration;
    fn lkey(&self) -> u32 {
        self.registration().lkey
    }
    fn rkey(&self) -> u32 {
        self.registration().rkey
    }
    fn addr(&self) -> u64 {
        self.registration().addr
    }
    fn length(&self) -> u64 {
        self.registration().length
    }
    fn access(&self) -> u32 {
        self.registration().access
    }
    fn pd_id(&self) -> u32 {
        self.registration().pd_id
    }
    /// After this returns, the backend never touches the range again.
    fn deregister(&self);
}

pub trait MemoryWindow: Send + Sync {
    /// The backend's own object behind the trait (a backend reaches its native handles through
    /// it when the core hands one of its objects back, e.g. the PD and CQs of `QpInit`).
    fn as_any(&self) -> &dyn Any;
    /// The current rkey (changes with every bind; 0 while unbound).
    fn rkey(&self) -> u32;
    /// The rkey the next bind will give (verbs: ibv_inc_rkey of the current one). Binds on one
    /// window are serialised by the caller.
    fn next_rkey(&self) -> u32;
    fn pd_id(&self) -> u32;
    /// Ends the window's current binding (it grants no access until bound again); used when a
    /// bind failed or was flushed, which leaves the window unbound.
    fn invalidate(&self);
    /// Invalidates the window's current binding; after this returns it grants no access.
    fn dealloc(&self);
}

#[derive(Clone, Copy, Debug, Default)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_rd_atomic: u32,
    pub max_inline: u32,
}

pub struct QpInit {
    pub pd: Arc<dyn ProtectionDomain>,
    pub send_cq: Arc<dyn CompletionQueue>,
    pub recv_cq: Arc<dyn CompletionQueue>,
    pub srq: Option<Arc<dyn SharedReceiveQueue>>,
    pub cap: QpCap,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Accepts receives; not connected.
    Init,
    Connecting,
    Connected,
    /// Every queued and every later request completes as Flushed.
    Error,
}

pub trait QueuePair: Send + Sync {
    /// The backend's own object behind the trait (a backend reaches its native handles through
    /// it when the core hands one of its objects back, e.g. the PD and CQs of `QpInit`).
    fn as_any(&self) -> &dyn Any;
    fn qp_num(&self) -> u32;
    fn state(&self) -> QpState;
    /// Valid in Connected (executed) and Error (flushed at once). By reference: the core
    /// builds the request once, in place, and a backend that hands it to the device copies
    /// nothing of it (one that keeps it clones what it keeps).
    /// Every completion of a request it took, flushed ones and those made without the
    /// device included, carries the request's `SendWr::ctx` (the backend keeps it in its
    /// own record of the request): the core may keep no record of its own.
    fn post_send(&self, wr: &SendWr) -> Result<()>;
    /// Valid in every state; in Error flushed at once.
    fn post_recv(&self, wr: RecvWr) -> Result<()>;
    /// Flushes everything outstanding and returns to Init (only from Error or Init).
    fn reset(&self) -> Result<()>;
    /// After `reset` this QP cannot connect again, so the EP replaces it with a new one
    /// (soft-iWARP: a QP never leaves ERROR; its modify to RESET does nothing).
    fn replaced_after_reset(&self) -> bool {
        false
    }
    /// Receives posted and not yet completed.
    fn posted_recvs(&self) -> u32;
    fn local_addr(&self) -> Option<SocketAddrV4>;
    fn remote_addr(&self) -> Option<SocketAddrV4>;
    /// Moves to Error (flushing) without telling the peer; used for abrupt teardown.
    fn destroy(&self);
    /// A datagram QP only: sends `wr` (op `SendOp::Send`) as one datagram to QP `remote_qpn`
    /// of the node `ah` leads to (verbs: the `ud` fields of ibv_send_wr). The request
    /// completes once the datagram has left; whether it arrives nobody learns.
    fn post_send_ud(&self, wr: SendWr, ah: &Arc<dyn AddressHandle>, remote_qpn: u32) -> Result<()> {
        let _ = (wr, ah, remote_qpn);
        Err(Error::Unsupported)
    }
}

/// Where datagrams for a remote node go (verbs: an ibv_ah made from the path to the remote
/// port). Dropping the last reference releases it (ibv_destroy_ah).
pub trait AddressHandle: Send + Sync {
    /// The backend's own object behind the trait.
    fn as_any(&self) -> &dyn Any;
    /// The IPv4 address of the remote IA it leads to.
    fn address(&self) -> Ipv4Addr;
}

/// A remote datagram QP as address resolution found it (verbs: the `ud` parameters of an
/// rdma_cm event: ah_attr, made into an address handle, and qp_num).
#[derive(Clone)]
pub struct UdPeer {
    pub ah: Arc<dyn AddressHandle>,
    pub qpn: u32,
}

impl std::fmt::Debug for UdPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UdPeer({} qpn {:#x})", self.ah.address(), self.qpn)
    }
}

pub trait SharedReceiveQueue: Send + Sync {
    /// The backend's own object behind the trait (a backend reaches its native handles through
    /// it when the core hands one of its objects back, e.g. the PD and CQs of `QpInit`).
    fn as_any(&self) -> &dyn Any;
    /// Unique within the device that created it.
    fn id(&self) -> u64;
    fn post_recv(&self, wr: RecvWr) -> Result<()>;
    /// Receives posted and not yet consumed (dat_srq_query's available_dto_count). A receive a
    /// QP consumed no longer counts by the time its completion can be polled: the core checks
    /// the SRQ's low watermark when it retires that completion (see the core's `srq` module).
    fn posted(&self) -> u32;
    fn max_wr(&self) -> u32;
    fn resize(&self, max_wr: u32) -> Result<()>;
    /// Completes every posted receive as Flushed on the CQ of the QP it was last bound to (or drops
    /// it if none); used when the SRQ is freed.
    fn destroy(&self);
}

/// Identifies a connection request until it is accepted or rejected.
pub type ConnRequestId = u64;

pub trait Listener: Send + Sync {
    fn id(&self) -> u64;
    fn port(&self) -> u16;
    fn close(&self);
}

#[derive(Clone, Debug)]
pub enum CmEvent {
    ConnectRequest {
        listener: u64,
        req: ConnRequestId,
        private_data: Vec<u8>,
        remote: SocketAddrV4,
        local: SocketAddrV4,
    },
    /// The QP is connected; for the active side `private_data` is the peer's accept data.
    Established {
        qp_num: u32,
        private_data: Vec<u8>,
    },
    Rejected {
        qp_num: u32,
        private_data: Vec<u8>,
        by_peer: bool,
    },
    Unreachable {
        qp_num: u32,
    },
    TimedOut {
        qp_num: u32,
    },
    /// Orderly disconnect (either side asked).
    Disconnected {
        qp_num: u32,
    },
    /// The connection failed (peer vanished, protocol error, remote access violation).
    Broken {
        qp_num: u32,
    },
    /// A request disappeared (requester gave up) before it was accepted or rejected.
    RequestCancelled {
        listener: u64,
        req: ConnRequestId,
    },
    /// A datagram QP asks a listener for its address (verbs: a connect request in rdma_cm's
    /// UDP port space). Answered with `Device::ud_accept` or `Device::reject`.
    UdRequest {
        listener: u64,
        req: ConnRequestId,
        private_data: Vec<u8>,
        remote: SocketAddrV4,
        local: SocketAddrV4,
    },
    /// The address resolution `id` that `Device::ud_resolve` started for QP `qp_num` completed:
    /// datagrams to the remote QP go to `peer`; `private_data` is the accepter's.
    UdResolved {
        qp_num: u32,
        id: u64,
        peer: UdPeer,
        private_data: Vec<u8>,
    },
    /// It failed: refused by the remote consumer (`by_peer`, with its reject private data), or
    /// nobody listening, no route, no answer in time, a peer without datagram service.
    UdFailed {
        qp_num: u32,
        id: u64,
        by_peer: bool,
        private_data: Vec<u8>,
    },
    /// The device failed or was removed (verbs: a fatal asynchronous event, rdma_cm's
    /// DEVICE_REMOVAL): every QP of it is broken (each its own `Broken`), what was posted
    /// completes flushed, and nothing new will work. Once per device.
    DeviceLost,
    /// Completion queue `cq` (`CompletionQueue::id`) overran: completions may be lost.
    CqOverrun {
        cq: u64,
    },
}

impl CmEvent {
    /// The active side's connection refused by no consumer of the peer (nobody listening, a
    /// handshake that failed here): NON_PEER_REJECTED, without private data.
    pub fn rejected_not_by_peer(qp_num: u32) -> CmEvent {
        CmEvent::Rejected {
            qp_num,
            private_data: Vec::new(),
            by_peer: false,
        }
    }
}

pub type CmHandler = Arc<dyn Fn(CmEvent) + Send + Sync>;

pub trait Device: Send + Sync {
    fn name(&self) -> String;
    fn address(&self) -> Ipv4Addr;
    fn attr(&self) -> DeviceAttr;
    fn alloc_pd(&self) -> Result<Arc<dyn ProtectionDomain>>;
    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CompletionQueue>>;
    fn create_qp(&self, init: QpInit) -> Result<Arc<dyn QueuePair>>;
    fn create_srq(
        &self,
        pd: &Arc<dyn ProtectionDomain>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Arc<dyn SharedReceiveQueue>>;

    // Connection manager.
    /// The one handler for every connection event of this device.
    fn set_cm_handler(&self, handler: Option<CmHandler>);
    /// Listens on `port` (0 = pick a free one).
    fn listen(&self, port: u16) -> Result<Arc<dyn Listener>>;
    fn connect(
        &self,
        qp: &Arc<dyn QueuePair>,
        remote: SocketAddrV4,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<()>;
    fn accept(
        &self,
        req: ConnRequestId,
        qp: &Arc<dyn QueuePair>,
        private_data: &[u8],
    ) -> Result<()>;
    fn reject(&self, req: ConnRequestId, private_data: &[u8]) -> Result<()>;
    /// Graceful: queued sends complete first, then the peer is told. Abrupt: flush now.
    fn disconnect(&self, qp: &Arc<dyn QueuePair>, abrupt: bool) -> Result<()>;

    /// Stops the device's progress engine; every QP goes to Error.
    fn close(&self);

    // Unreliable datagrams (only where `DeviceAttr::ud`).
    /// Creates a datagram QP (verbs: IBV_QPT_UD, brought to RTS at once): it sends
    /// (`QueuePair::post_send_ud`, at most `DeviceAttr::mtu` bytes) and receives without any
    /// connection, state Connected from the start. A datagram lands in the receive posted
    /// first, after a GRH_LEN-byte area (byte_len counts it); one that finds no receive posted
    /// is dropped (`ud_dropped`), one larger than its receive completes it with LocalLength.
    /// A request that fails moves the QP to Error (the rest flushed) with `CmEvent::Broken`;
    /// `disconnect` moves it to Error with `CmEvent::Disconnected`; `reset` back to Connected.
    fn create_ud_qp(&self, init: QpInit) -> Result<Arc<dyn QueuePair>> {
        let _ = init;
        Err(Error::Unsupported)
    }
    /// Starts resolving the address of the datagram QP a consumer accepts on behind the
    /// listener at `remote`, for datagram QP `qp`, offering `private_data`; returns the id
    /// the outcome (`CmEvent::UdResolved` or `UdFailed`) carries. Any number may be under way
    /// on one QP; the QP's state does not change.
    fn ud_resolve(
        &self,
        qp: &Arc<dyn QueuePair>,
        remote: SocketAddrV4,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<u64> {
        let _ = (qp, remote, private_data, timeout);
        Err(Error::Unsupported)
    }
    /// Answers a `CmEvent::UdRequest` with datagram QP `qp`'s address and `private_data`;
    /// returns where the requester's QP is.
    fn ud_accept(
        &self,
        req: ConnRequestId,
        qp: &Arc<dyn QueuePair>,
        private_data: &[u8],
    ) -> Result<UdPeer> {
        let _ = (req, qp, private_data);
        Err(Error::Unsupported)
    }
    /// Datagrams dropped on arrival since the device opened because their QP had no receive
    /// posted (verbs: the port's "UD silently dropped" diagnostic).
    fn ud_dropped(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod sge_list_tests {
    use super::{Sge, SgeList};

    fn sge(i: u64) -> Sge {
        Sge {
            addr: 0x1000 * i,
            length: i as u32,
            lkey: i as u32 + 7,
        }
    }

    /// Inline up to four segments, on the heap past them, the same list either way.
    #[test]
    fn a_list_keeps_its_segments_in_order_inline_or_not() {
        for n in 0..10u64 {
            let l: SgeList = (0..n).map(sge).collect();
            assert_eq!(l.len(), n as usize);
            assert!(l.iter().zip(0..n).all(|(s, i)| *s == sge(i)));
            let mut t = l.clone();
            t.truncate(2);
            assert_eq!(t.len(), (n as usize).min(2));
            t.push(sge(99));
            assert_eq!(t.last(), Some(&sge(99)));
            t[0].length = 0;
            assert_eq!(t[0].length, 0);
        }
        assert_eq!(
            SgeList::from(vec![sge(1), sge(2)]),
            [sge(1), sge(2)].into_iter().collect()
        );
    }
}
