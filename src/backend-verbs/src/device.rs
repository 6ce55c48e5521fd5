//! The IA as the core sees it (`VerbsDevice`): opening "verbs <device> [port]" (the device
//! context rdma_cm uses, what the device and port offer, the IA's channels, the probes and
//! guards some devices need), and the `Device` calls, each handed to the object or the
//! connection manager it concerns.

use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use rdma_sys::*;

use super::cm;
use super::cm_state::CmState;
use super::cq::VerbsCq;
use super::qp::VerbsQp;
use super::shared::Shared;
use super::sys::{self, Ptr};
use super::{events, fault, mem, sink, srq};
use daplrs_backend::intmap::IntMap;
use daplrs_backend::{
    CmHandler, CompletionQueue, ConnRequestId, Device, DeviceAttr, Listener, ProtectionDomain,
    QpInit, QueuePair, SharedReceiveQueue,
};
use daplrs_backend::{Error, Resource, Result};

/// siw's vendor id ("bmt", drivers/infiniband/sw/siw/siw.h SIW_VENDOR_ID).
const SIW_VENDOR_ID: u32 = 0x626d74;

/// Private data an IB connect request carries (92 bytes minus rdma_cm's header).
const MAX_PRIVATE_DATA: u32 = 56;

/// Inline payload asked of the device (small sends and writes skip the DMA read).
const MAX_INLINE: u32 = 128;

/// An open IA: its state, which its objects share, and its event thread (events.rs).
pub struct VerbsDevice {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// ia_params after "verbs": a device name with an optional port, a netdev or an IPv4 address.
fn parse_target(target: &str, port: Option<&str>) -> Result<(String, Option<u8>), String> {
    let port = match port {
        Some(p) => Some(
            p.parse::<u8>()
                .map_err(|_| format!("bad port number '{p}' in ia_params"))?,
        ),
        None => None,
    };
    Ok((target.to_string(), port))
}

/// Why "verbs <target> [port]" names no usable RDMA port (None when it does).
pub fn diagnose(target: &str, port: Option<&str>) -> Option<String> {
    let (target, port) = match parse_target(target, port) {
        Ok(x) => x,
        Err(e) => return Some(e),
    };
    let p = match sys::find_port(&target, port) {
        Ok(p) => p,
        Err(e) => return Some(e),
    };
    match open_context(&p) {
        Ok((ctx, _)) => {
            let _ = ctx;
            None
        }
        Err(e) => Some(e),
    }
}

/// The device context rdma_cm uses for `p.device` (PDs and CQs must live on the context the
/// CM ids see), and the port's attributes.
fn open_context(p: &sys::PortInfo) -> Result<(Ptr<ibv_context>, ibv_port_attr), String> {
    let mut n = 0;
    // SAFETY: rdma_get_devices returns an array of n contexts owned by librdmacm.
    let list = unsafe { rdma_get_devices(&mut n) };
    if list.is_null() {
        return Err(format!(
            "rdma_get_devices: {} (is rdma-core's user-space driver for {} installed, e.g. \
             Debian's ibverbs-providers?)",
            std::io::Error::last_os_error(),
            p.device
        ));
    }
    let mut found = Ptr::null();
    let mut names = Vec::new();
    for i in 0..n as usize {
        // SAFETY: i < n.
        let ctx = unsafe { *list.add(i) };
        // SAFETY: a live context and its device.
        let name = sys::cstr(unsafe { ibv_get_device_name((*ctx).device) });
        if name == p.device {
            found = Ptr(ctx);
        }
        names.push(name);
    }
    // SAFETY: frees only the array.
    unsafe { rdma_free_devices(list) };
    if found.is_null() {
        return Err(format!(
            "RDMA device {} is not usable from user space (user-space devices: {}; is its \
             rdma-core driver installed?)",
            p.device,
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        ));
    }
    // SAFETY: plain data; ___ibv_query_port is the C behaviour of ibv_query_port.
    let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `found` is a live context.
    let rc = unsafe { ___ibv_query_port(found.0, p.port, &mut pa) };
    if rc != 0 {
        return Err(sys::os_error(
            &format!("ibv_query_port({}, {})", p.device, p.port),
            rc,
        ));
    }
    if pa.state != ibv_port_state::IBV_PORT_ACTIVE {
        return Err(format!(
            "port {} of {} is not active (state {})",
            p.port, p.device, pa.state
        ));
    }
    Ok((found, pa))
}

impl VerbsDevice {
    /// Opens "verbs <device> [port]" / "verbs <netdev>" / "verbs <IPv4 address>".
    pub fn open(target: &str, port: Option<&str>) -> Result<Arc<VerbsDevice>> {
        let not_found = Error::NoDevice;
        let (target, port) = parse_target(target, port).map_err(|_| not_found)?;
        let p = sys::find_port(&target, port).map_err(|e| {
            log::warn!("verbs: {e}");
            not_found
        })?;
        let (ctx, pa) = open_context(&p).map_err(|e| {
            log::warn!("verbs: {e}");
            not_found
        })?;
        // SAFETY: plain data; a live context.
        let mut da: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { ibv_query_device(ctx.0, &mut da) } != 0 {
            return Err(not_found);
        }
        let mw_type2 = da.device_cap_flags & ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0
            != 0
            && da.max_mw > 0;
        // SAFETY: a live context and its device.
        let iwarp =
            unsafe { (*(*ctx.0).device).transport_type } == ibv_transport_type::IBV_TRANSPORT_IWARP;
        let attr = device_attr(&da, &pa, iwarp);
        let siw = da.vendor_id == SIW_VENDOR_ID;
        if siw {
            siw_key_guard(ctx);
        }
        let (cq_resize, probe_cq) = probe_cq_resize(ctx);
        let (comp_channel, cm_channel, wake) = channels(ctx)?;
        let shared = Arc::new(Shared {
            // What datinfo shows as the adapter: device, port, interface, GID, link.
            name: adapter_name(ctx, &p, &attr, iwarp),
            addr: p.addr.unwrap_or(Ipv4Addr::UNSPECIFIED),
            port: p.port,
            ctx,
            attr,
            max_inline: MAX_INLINE,
            mw_type2,
            read_sink: sink::ReadSink::for_device(iwarp, siw),
            checks_remote_read: !siw,
            read_sge_limit: read_sge_limit(&da),
            cq_resize,
            probe_cq,
            recv_needs_sge: siw,
            iwarp,
            comp_channel,
            cm_channel,
            wake,
            cm_handler: Mutex::new(None),
            deferred: Mutex::new(Vec::new()),
            cqs: Mutex::new(IntMap::default()),
            cm: Mutex::new(CmState::default()),
            closing: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            drivers: AtomicU32::new(0),
        });
        fault::register(&shared);
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name("daplrs-verbs".into())
            .spawn(move || events::event_loop(s2))
            .map_err(|_| Error::NoResource(Resource::Device))?;
        log::debug!(
            "verbs: opened {} at {} (gid index {})",
            shared.name,
            shared.addr,
            p.gid_index
        );
        Ok(Arc::new(VerbsDevice {
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }
}

/// What the device and its port offer (`ibv_query_device`, `ibv_query_port`), as the core
/// sees it: iWARP has no datagrams, no immediate data, and reads into `max_sge_rd` segments.
fn device_attr(da: &ibv_device_attr, pa: &ibv_port_attr, iwarp: bool) -> DeviceAttr {
    let u = |x: i32| x.max(0) as u32;
    let transport = if iwarp {
        "iWARP"
    } else if pa.link_layer == 2
    /* IBV_LINK_LAYER_ETHERNET */
    {
        "RoCE"
    } else {
        "InfiniBand"
    };
    DeviceAttr {
        max_qp: u(da.max_qp),
        max_qp_wr: u(da.max_qp_wr),
        max_sge: u(da.max_sge),
        max_cq: u(da.max_cq),
        max_cqe: u(da.max_cqe),
        max_mr: u(da.max_mr),
        max_mr_size: da.max_mr_size.min(daplrs_backend::MAX_REGION_BYTES),
        max_pd: u(da.max_pd),
        max_mw: u(da.max_mw),
        max_srq: u(da.max_srq),
        max_srq_wr: u(da.max_srq_wr),
        max_msg_size: pa.max_msg_sz,
        max_rdma_size: pa.max_msg_sz,
        max_rd_atomic: u(da.max_qp_rd_atom.min(da.max_qp_init_rd_atom)),
        max_private_data: MAX_PRIVATE_DATA,
        // The port's active MTU (enum ibv_mtu: 1 = 256 bytes ... 5 = 4096), the path MTU
        // rdma_cm gives our connections on this port.
        mtu: 128u32 << pa.active_mtu,
        // Datagram QPs (IBV_QPT_UD), resolved through rdma_cm's UDP port space; iWARP
        // is connections only.
        ud: !iwarp,
        // As many as any request takes: on iWARP a read with more segments than the device
        // reads into goes as one read per run of segments (`read_sge_limit`, qp.rs).
        max_rdma_read_sge: if iwarp {
            u(da.max_sge)
        } else {
            read_sge_limit(da)
        },
        atomics: da.atomic_cap != ibv_atomic_cap::IBV_ATOMIC_NONE,
        pins_for_write: true,
        // siw pins against the limit whatever the process may lock (siw_mem.c); the others,
        // through ib_umem_get, only a process without CAP_IPC_LOCK.
        pin_limit: sys::pin_limit(da.vendor_id == SIW_VENDOR_ID),
        write_imm: !iwarp,
        transport,
    }
}

/// The segments one RDMA read may have on this device: `max_sge_rd` (siw reads into one), or
/// as for other requests where the device does not say (0).
fn read_sge_limit(da: &ibv_device_attr) -> u32 {
    let u = |x: i32| x.max(0) as u32;
    match da.max_sge_rd {
        n if n > 0 => u(n.min(da.max_sge)),
        _ => u(da.max_sge),
    }
}

/// The IA's channels: completions (EVDs with a CNO), rdma_cm events, and the event thread's
/// wake-up eventfd; each nonblocking, as the device context's async fd is made too.
fn channels(
    ctx: Ptr<ibv_context>,
) -> Result<(Ptr<ibv_comp_channel>, Ptr<rdma_event_channel>, OwnedFd)> {
    // SAFETY: a live context.
    let comp_channel = unsafe { ibv_create_comp_channel(ctx.0) };
    if comp_channel.is_null() {
        return Err(Error::NoResource(Resource::Device));
    }
    // SAFETY: plain constructor.
    let cm_channel = unsafe { rdma_create_event_channel() };
    if cm_channel.is_null() {
        // SAFETY: the channel we just created.
        unsafe { ibv_destroy_comp_channel(comp_channel) };
        return Err(Error::NoResource(Resource::Device));
    }
    let Some(wake) = sys::eventfd() else {
        // SAFETY: the channels we just created, used by nobody.
        unsafe {
            rdma_destroy_event_channel(cm_channel);
            ibv_destroy_comp_channel(comp_channel);
        }
        return Err(Error::NoResource(Resource::Device));
    };
    // SAFETY: descriptors of the objects above.
    unsafe {
        sys::set_nonblocking((*comp_channel).fd);
        sys::set_nonblocking((*cm_channel).fd);
        sys::set_nonblocking((*ctx.0).async_fd);
    }
    Ok((Ptr(comp_channel), Ptr(cm_channel), wake))
}

/// What datinfo shows as the adapter: device, port, interface, transport, GID (not on iWARP,
/// whose "GID" is its MAC address), link, MTU.
fn adapter_name(
    ctx: Ptr<ibv_context>,
    p: &sys::PortInfo,
    attr: &DeviceAttr,
    iwarp: bool,
) -> String {
    // SAFETY: plain data; a live context.
    let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let gid = if unsafe { ibv_query_gid(ctx.0, p.port, p.gid_index as i32, &mut gid) } == 0 {
        // SAFETY: the raw view of the union.
        let raw = unsafe { gid.raw };
        raw.chunks(2)
            .map(|c| format!("{:x}", u16::from_be_bytes([c[0], c[1]])))
            .collect::<Vec<_>>()
            .join(":")
    } else {
        "?".to_string()
    };
    format!(
        "{} port {} ({}, {}, {}link active, MTU {})",
        p.device,
        p.port,
        p.netdev,
        attr.transport,
        if iwarp {
            String::new()
        } else {
            format!("GID[{}] {}, ", p.gid_index, gid)
        },
        attr.mtu
    )
}

/// Whether the device resizes a CQ: a CQ of one entry is grown to two. soft-iWARP (siw) has
/// no resize (libibverbs answers EOPNOTSUPP). The CQ is returned, to be kept while the device
/// is open.
fn probe_cq_resize(ctx: Ptr<ibv_context>) -> (bool, Ptr<ibv_cq>) {
    // SAFETY: a live context; the caller destroys the CQ when the device closes.
    let cq = unsafe { ibv_create_cq(ctx.0, 1, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
    if cq.is_null() {
        return (false, Ptr::null());
    }
    // SAFETY: the CQ just created, used by nobody else.
    let ok = unsafe { ibv_resize_cq(cq, 2) } == 0;
    (ok, Ptr(cq))
}

/// siw hands user space each CQ and queue of a QP as an mmap offset of the context, given out
/// first-fit by page from 0, and libsiw (rdma-core) takes the byte offset 0x90000
/// (SIW_INVAL_UOBJ_KEY, page 0x90) for "no mapping": a queue the kernel placed at page 0x90
/// is destroyed again and its creation fails, and so does every later one while the pages
/// below stay in use (a dtestcm server's seventh EP; IAs opened and closed by threads in
/// turn). So the first device opened on a context makes a CQ of 32,768 entries (1 MiB + 8 B:
/// 257 pages from page 0 of the fresh context) that covers page 0x90, and keeps it as long as
/// the context: librdmacm's, which lives until the process ends. Made later, or per device,
/// it could land above a hole that takes page 0x90.
fn siw_key_guard(ctx: Ptr<ibv_context>) {
    static GUARDED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    const ENTRIES: i32 = 32_768;
    let mut guarded = GUARDED.lock();
    if guarded.contains(&(ctx.0 as usize)) {
        return;
    }
    // SAFETY: a live context, which librdmacm keeps open until the process ends; the CQ is
    // never destroyed (it goes with the context).
    let cq = unsafe {
        ibv_create_cq(
            ctx.0,
            ENTRIES,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if cq.is_null() {
        log::warn!("verbs: siw key guard CQ: errno {}", sys::errno());
        return;
    }
    guarded.push(ctx.0 as usize);
}

impl Device for VerbsDevice {
    fn name(&self) -> String {
        self.shared.name.clone()
    }
    fn address(&self) -> Ipv4Addr {
        self.shared.addr
    }
    fn attr(&self) -> DeviceAttr {
        self.shared.attr.clone()
    }
    fn alloc_pd(&self) -> Result<Arc<dyn ProtectionDomain>> {
        Ok(mem::VerbsPd::alloc(&self.shared)?)
    }
    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CompletionQueue>> {
        Ok(VerbsCq::create(&self.shared, depth)?)
    }
    fn create_qp(&self, init: QpInit) -> Result<Arc<dyn QueuePair>> {
        Ok(VerbsQp::create(&self.shared, init)?)
    }
    fn create_srq(
        &self,
        pd: &Arc<dyn ProtectionDomain>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Arc<dyn SharedReceiveQueue>> {
        Ok(srq::VerbsSrq::create(&self.shared, &**pd, max_wr, max_sge)?)
    }
    fn set_cm_handler(&self, handler: Option<CmHandler>) {
        *self.shared.cm_handler.lock() = handler;
    }
    fn listen(&self, port: u16) -> Result<Arc<dyn Listener>> {
        Ok(cm::listen(&self.shared, port)?)
    }
    fn connect(
        &self,
        qp: &Arc<dyn QueuePair>,
        remote: std::net::SocketAddrV4,
        private_data: &[u8],
        timeout: Option<std::time::Duration>,
    ) -> Result<()> {
        cm::connect(&self.shared, own_qp(qp)?, remote, private_data, timeout)
    }
    fn accept(
        &self,
        req: ConnRequestId,
        qp: &Arc<dyn QueuePair>,
        private_data: &[u8],
    ) -> Result<()> {
        cm::accept(&self.shared, req, own_qp(qp)?, private_data)
    }
    fn reject(&self, req: ConnRequestId, private_data: &[u8]) -> Result<()> {
        cm::reject(&self.shared, req, private_data)
    }
    fn disconnect(&self, qp: &Arc<dyn QueuePair>, abrupt: bool) -> Result<()> {
        cm::disconnect(&self.shared, own_qp(qp)?, abrupt)
    }
    fn create_ud_qp(&self, init: QpInit) -> Result<Arc<dyn QueuePair>> {
        Ok(VerbsQp::create_ud(&self.shared, init)?)
    }
    fn ud_resolve(
        &self,
        qp: &Arc<dyn QueuePair>,
        remote: std::net::SocketAddrV4,
        private_data: &[u8],
        timeout: Option<std::time::Duration>,
    ) -> Result<u64> {
        cm::ud_resolve(&self.shared, own_qp(qp)?, remote, private_data, timeout)
    }
    fn ud_accept(
        &self,
        req: ConnRequestId,
        qp: &Arc<dyn QueuePair>,
        private_data: &[u8],
    ) -> Result<daplrs_backend::UdPeer> {
        cm::ud_accept(&self.shared, req, own_qp(qp)?, private_data)
    }
    fn close(&self) {
        if self.shared.closing.swap(true, Ordering::SeqCst) {
            return;
        }
        self.shared.kick();
        if let Some(t) = self.thread.lock().take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        cm::close_all(&self.shared);
    }
}

impl Drop for VerbsDevice {
    fn drop(&mut self) {
        self.close();
    }
}

/// Our QP behind the trait object the core hands over (`Error::Internal` if it is not one,
/// or is going).
fn own_qp(qp: &Arc<dyn QueuePair>) -> Result<Arc<VerbsQp>> {
    qp.as_any()
        .downcast_ref::<VerbsQp>()
        .and_then(|v| v.me.upgrade())
        .ok_or(Error::Internal)
}
