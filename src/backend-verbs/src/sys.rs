//! Small helpers around rdma-sys: a Send/Sync raw-pointer wrapper, errno, socket addresses, and
//! finding an RDMA device, port and IPv4 address from what ia_params names (sysfs).

use std::ffi::CStr;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// A native verbs object owned by one of our wrappers. The wrappers decide when it is freed;
/// verbs objects may be used from any thread.
pub(super) struct Ptr<T>(pub *mut T);

impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Ptr<T> {}
// SAFETY: libibverbs and librdmacm objects are thread-safe handles; ownership and lifetime are
// managed by the wrapper that holds the pointer.
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    pub fn null() -> Self {
        Ptr(std::ptr::null_mut())
    }
    pub fn is_null(&self) -> bool {
        self.0.is_null()
    }
}

/// A pollfd waiting for `fd` to be readable.
pub(super) fn pollin(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// A non-blocking eventfd: one thread sleeps in poll(2) on it, others `signal` it.
pub(super) fn eventfd() -> Option<OwnedFd> {
    // SAFETY: a plain syscall; the descriptor is owned from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    // SAFETY: a descriptor we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn eventfd_signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes to an eventfd.
    unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const _, 8) };
}

/// Clears a signalled eventfd.
pub(super) fn eventfd_clear(fd: &OwnedFd) {
    let mut v: u64 = 0;
    // SAFETY: reading 8 bytes from an eventfd.
    unsafe { libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut _, 8) };
}

/// The 2.0 triplets of a request as the device's scatter list (same layout, no copy of data).
/// A scatter-gather list as verbs takes it: our `Sge` has ibv_sge's layout (asserted
/// below), so the list is handed over as it is, with no copy or allocation. The hardware
/// driver only reads it (ibv_post_send/ibv_post_recv take a mutable pointer by C habit).
pub(super) fn sge_ptr(sgl: &[daplrs_backend::Sge]) -> *mut rdma_sys::ibv_sge {
    sgl.as_ptr() as *mut rdma_sys::ibv_sge
}
const _: () = {
    use daplrs_backend::Sge;
    use rdma_sys::ibv_sge;
    assert!(std::mem::size_of::<Sge>() == std::mem::size_of::<ibv_sge>());
    assert!(std::mem::align_of::<Sge>() == std::mem::align_of::<ibv_sge>());
    assert!(std::mem::offset_of!(Sge, addr) == std::mem::offset_of!(ibv_sge, addr));
    assert!(std::mem::offset_of!(Sge, length) == std::mem::offset_of!(ibv_sge, length));
    assert!(std::mem::offset_of!(Sge, lkey) == std::mem::offset_of!(ibv_sge, lkey));
};

pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// "what: strerror" for the current errno, or for a returned error number.
pub(super) fn os_error(what: &str, err: i32) -> String {
    format!("{what}: {}", std::io::Error::from_raw_os_error(err))
}

pub(super) fn sockaddr_in(addr: SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is plain data; all-zero is a valid value.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = addr.port().to_be();
    sin.sin_addr.s_addr = u32::from(*addr.ip()).to_be();
    sin
}

pub(super) fn from_sockaddr_in(sin: &libc::sockaddr_in) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        u16::from_be(sin.sin_port),
    )
}

pub(super) fn set_nonblocking(fd: i32) {
    // SAFETY: fcntl on a descriptor we were given by libibverbs/librdmacm.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}

pub(super) fn cstr(p: *const libc::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string owned by libibverbs.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// One RDMA port with the network interface (and its IPv4 address) behind it.
#[derive(Clone, Debug)]
pub(super) struct PortInfo {
    pub device: String,
    pub port: u8,
    pub netdev: String,
    pub gid_index: u32,
    pub addr: Option<Ipv4Addr>,
}

const SYS_IB: &str = "/sys/class/infiniband";

/// The (device, port) rdma_cm binds each local IPv4 address to, with that address's interface.
/// iWARP ports have no GID table in sysfs (their netdev is only in the RDMA netlink), so this
/// asks rdma_cm itself: the device it picks for an address is the one our connections get.
fn cm_bound_ports() -> Vec<(String, u8, String, Ipv4Addr)> {
    use rdma_sys::*;
    let mut out = Vec::new();
    let Ok(ifs) = daplrs_backend::netif::ipv4_interfaces() else {
        return out;
    };
    for (ifname, ip) in ifs {
        if ip.is_loopback() {
            continue;
        }
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: a synchronous id (no channel), destroyed below.
        if unsafe {
            rdma_create_id(
                std::ptr::null_mut(),
                &mut id,
                std::ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        } != 0
        {
            return out;
        }
        let mut sin = sockaddr_in(SocketAddrV4::new(ip, 0));
        // SAFETY: a live id and a sockaddr_in that outlives the call.
        let bound =
            unsafe { rdma_bind_addr(id, &mut sin as *mut libc::sockaddr_in as *mut _) } == 0;
        // SAFETY: a live id; verbs is set when the address is on an RDMA device.
        let verbs = unsafe { (*id).verbs };
        if bound && !verbs.is_null() {
            // SAFETY: a live context of librdmacm's.
            let dev = cstr(unsafe { rdma_sys::ibv_get_device_name((*verbs).device) });
            // SAFETY: a live id.
            let port = unsafe { (*id).port_num };
            out.push((dev, port, ifname.to_string_lossy().into_owned(), ip));
        }
        // SAFETY: the id created above, with no events outstanding.
        unsafe { rdma_destroy_id(id) };
    }
    out
}

/// Every (device, port, netdev) the kernel lists, from sysfs (RoCE ports name their netdev per
/// GID entry; the first GID entry that has one is taken); ports without one (iWARP) take the
/// interface rdma_cm binds to them (`cm_bound_ports`).
pub(super) fn ports() -> Vec<PortInfo> {
    let mut out = ports_sysfs();
    if out.iter().any(|p| p.netdev.is_empty()) {
        let bound = cm_bound_ports();
        for p in out.iter_mut().filter(|p| p.netdev.is_empty()) {
            if let Some((_, _, n, a)) = bound.iter().find(|b| b.0 == p.device && b.1 == p.port) {
                p.netdev = n.clone();
                p.addr = Some(*a);
            }
        }
    }
    out
}

fn ports_sysfs() -> Vec<PortInfo> {
    let mut out = Vec::new();
    let Ok(devs) = std::fs::read_dir(SYS_IB) else {
        return out;
    };
    let mut devs: Vec<String> = devs
        .flatten()
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .collect();
    devs.sort();
    for dev in devs {
        let Ok(ports) = std::fs::read_dir(Path::new(SYS_IB).join(&dev).join("ports")) else {
            continue;
        };
        let mut nums: Vec<u8> = ports
            .flatten()
            .filter_map(|p| p.file_name().to_string_lossy().parse().ok())
            .collect();
        nums.sort();
        for port in nums {
            let found = daplrs_backend::netif::rdma_port_netdev(&dev, port);
            let (gid_index, netdev) = found.unwrap_or((0, String::new()));
            let addr = if netdev.is_empty() {
                None
            } else {
                daplrs_backend::netif::resolve_address(&netdev).ok()
            };
            out.push(PortInfo {
                device: dev.clone(),
                port,
                netdev,
                gid_index,
                addr,
            });
        }
    }
    out
}

/// The port that "verbs <device> [port]", "verbs <netdev>" or "verbs <IPv4 address>" names,
/// or why none is.
pub(super) fn find_port(target: &str, port: Option<u8>) -> Result<PortInfo, String> {
    let all = ports();
    if all.is_empty() {
        return Err(
            "no RDMA device on this host (/sys/class/infiniband is empty: no NIC, or rdma-core's \
             kernel modules are not loaded)"
                .to_string(),
        );
    }
    let ip: Option<Ipv4Addr> = target.parse().ok();
    let hit = all.iter().find(|p| {
        let by_dev = p.device == target && (port.is_none() || port == Some(p.port));
        let by_netdev = !p.netdev.is_empty() && p.netdev == target;
        let by_ip = ip.is_some() && p.addr == ip;
        by_dev || by_netdev || by_ip
    });
    match hit {
        Some(p) if p.addr.is_some() => Ok(p.clone()),
        Some(p) => Err(format!(
            "RDMA port {}:{} has no network interface with an IPv4 address (netdev '{}'); \
             rdma_cm needs one",
            p.device, p.port, p.netdev
        )),
        None => {
            let list: Vec<String> = all
                .iter()
                .map(|p| format!("{} port {} ({})", p.device, p.port, p.netdev))
                .collect();
            Err(format!(
                "no RDMA port matches '{target}'{} (this host has: {})",
                port.map(|n| format!(" port {n}")).unwrap_or_default(),
                list.join(", ")
            ))
        }
    }
}

/// The locked-memory limit registrations pin against (`DeviceAttr::pin_limit`): RLIMIT_MEMLOCK
/// when finite and, unless `always` (siw), the process lacks CAP_IPC_LOCK (with it,
/// ib_umem_get pins past the limit).
pub(super) fn pin_limit(always: bool) -> Option<u64> {
    // SAFETY: plain data, filled by getrlimit(2).
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0
        || r.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    (always || !may_lock_any()).then_some(r.rlim_cur)
}

/// Whether the process has CAP_IPC_LOCK in its effective set (/proc/self/status, CapEff).
fn may_lock_any() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}
