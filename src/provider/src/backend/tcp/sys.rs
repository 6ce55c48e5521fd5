//! The TCP backend's only unsafe code: copying into and out of registered memory, poll(2), and
//! reading interface addresses with getifaddrs(3).

use std::ffi::CStr;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;

/// Copies `out.len()` bytes starting at address `addr` of this process into `out`.
///
/// # Safety
/// `[addr, addr + out.len())` must lie inside a live registration: the consumer promised (by
/// registering it) that the range is mapped, and the caller holds the key registry lock, which
/// deregistration also takes, so the registration cannot end during the copy.
pub(super) unsafe fn copy_from_registered(addr: u64, out: &mut [u8]) {
    if out.is_empty() {
        return;
    }
    std::ptr::copy_nonoverlapping(addr as usize as *const u8, out.as_mut_ptr(), out.len());
}

/// Returns a copy of `len` bytes at `addr` (without zero-filling the new buffer first).
///
/// # Safety
/// As for `copy_from_registered`.
pub(super) unsafe fn read_registered(addr: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    if len > 0 {
        std::ptr::copy_nonoverlapping(addr as usize as *const u8, out.as_mut_ptr(), len);
        // The first `len` bytes were just initialised by the copy.
        out.set_len(len);
    }
    out
}

/// Copies `data` into this process's memory at `addr`.
///
/// # Safety
/// As for `copy_from_registered`, and the registration grants write access.
pub(super) unsafe fn copy_to_registered(addr: u64, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    std::ptr::copy_nonoverlapping(data.as_ptr(), addr as usize as *mut u8, data.len());
}

pub(super) use libc::{POLLERR, POLLHUP, POLLIN, POLLNVAL, POLLOUT};

#[derive(Clone, Copy)]
pub(super) struct PollFd(libc::pollfd);

impl PollFd {
    pub fn new(fd: RawFd, events: i16) -> PollFd {
        PollFd(libc::pollfd {
            fd,
            events,
            revents: 0,
        })
    }
    pub fn revents(&self) -> i16 {
        self.0.revents
    }
}

/// poll(2) over `fds`; EINTR counts as "nothing ready".
pub(super) fn poll(fds: &mut [PollFd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: PollFd is repr(transparent)-equivalent (a single libc::pollfd field, no padding
    // added by a newtype of one field), the pointer and length describe `fds` exactly.
    let rc = unsafe {
        libc::poll(
            fds.as_mut_ptr() as *mut libc::pollfd,
            fds.len() as libc::nfds_t,
            timeout_ms,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(rc as usize)
}

/// The IPv4 address of network interface `name`, if it has one.
pub(super) fn interface_ipv4(name: &str) -> io::Result<Option<Ipv4Addr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = None;
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned and we have not freed it.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_name.is_null() || ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let ifname = unsafe { CStr::from_ptr(ifa.ifa_name) };
        if ifname.to_bytes() != name.as_bytes() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr of at least sa_family.
        let family = unsafe { (*ifa.ifa_addr).sa_family };
        if i32::from(family) == libc::AF_INET {
            // SAFETY: for AF_INET the sockaddr is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            found = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            break;
        }
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}
