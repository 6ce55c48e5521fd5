//! The TCP backend's only unsafe code: copying into and out of registered memory, poll(2),
//! socket writes with sendmsg(2), and reading interface addresses with getifaddrs(3) and
//! their MTU with ioctl(SIOCGIFMTU), and the progress thread's epoll(7) set.

use std::io::{self, IoSlice};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};

/// Copies `out.len()` bytes starting at address `addr` of this process into `out`; false if
/// they are not all there: the consumer may unmap registered memory, and a fault in the copy
/// is then recovered (`guarded`), not the end of the process.
///
/// # Safety
/// `[addr, addr + out.len())` lies inside a live registration and the caller holds the key
/// registry lock, so the registration cannot end during the copy.
pub(super) unsafe fn copy_from_registered(addr: u64, out: &mut [u8]) -> bool {
    // SAFETY: `out` is ours; the range is the caller's promise.
    unsafe {
        daplrs_backend::guarded::copy(out.as_mut_ptr(), addr as usize as *const u8, out.len())
    }
}

/// Returns a copy of `len` bytes at `addr` (without zero-filling the new buffer first); None
/// if they are not all there.
///
/// # Safety
/// As for `copy_from_registered`.
pub(super) unsafe fn read_registered(addr: u64, len: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(len);
    // SAFETY: the vector's capacity is `len` bytes; the range is the caller's promise.
    if !unsafe { daplrs_backend::guarded::copy(out.as_mut_ptr(), addr as usize as *const u8, len) }
    {
        return None;
    }
    // SAFETY: the first `len` bytes were just initialised by the copy.
    unsafe { out.set_len(len) };
    Some(out)
}

/// Copies `data` into this process's memory at `addr`; false if it is not all there,
/// writable.
///
/// # Safety
/// As for `copy_from_registered`, and the registration grants write access.
pub(super) unsafe fn copy_to_registered(addr: u64, data: &[u8]) -> bool {
    // SAFETY: `data` is only read; the range is the caller's promise.
    unsafe { daplrs_backend::guarded::copy(addr as usize as *mut u8, data.as_ptr(), data.len()) }
}

/// A 64-bit atomic on this process's word at `addr`: fetch-and-add of `operand`, or with
/// `swap` compare-and-swap against `operand`. Returns the previous value; None if the word is
/// not there (or not writable) any more (`guarded`).
///
/// # Safety
/// `addr` is 8-byte aligned and the 8 bytes lie in a live registration granting remote atomic
/// access (the consumer's memory may be touched by its own threads at the same time, which is
/// why the access is atomic).
pub(super) unsafe fn atomic_registered(addr: u64, operand: u64, swap: Option<u64>) -> Option<u64> {
    // SAFETY: the caller's promise.
    unsafe { daplrs_backend::guarded::atomic(addr as usize as *mut u64, operand, swap) }
}

pub(super) use libc::{POLLERR, POLLHUP, POLLIN, POLLNVAL, POLLOUT, POLLRDHUP};

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
    /// Adds `events` to what poll reported (a same-host ring holds data or has room).
    pub fn mark(&mut self, events: i16) {
        self.0.revents |= events;
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
    poll_result(rc)
}

/// A poll(2)/ppoll(2) return value: ready descriptors, EINTR as none.
fn poll_result(rc: libc::c_int) -> io::Result<usize> {
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(rc as usize)
}

/// ppoll(2) over `fds` for at most `timeout` (microsecond precision, where poll(2) has
/// milliseconds); EINTR counts as "nothing ready".
pub(super) fn poll_for(fds: &mut [PollFd], timeout: std::time::Duration) -> io::Result<usize> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: as for `poll`; `ts` is a valid timespec and no signal mask is passed.
    let rc = unsafe {
        libc::ppoll(
            fds.as_mut_ptr() as *mut libc::pollfd,
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    poll_result(rc)
}

/// An epoll(7) instance the progress thread polls (its descriptor is readable while any
/// socket in it is): the one set of descriptors another thread can change while the progress
/// thread sleeps, without waking it.
pub(super) struct Epoll(std::os::fd::OwnedFd);

impl Epoll {
    pub(super) fn new() -> io::Result<Epoll> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain system call with a constant argument.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        Ok(Epoll(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    /// Watches `fd` for input (hang-ups and errors always count), level-triggered, reported
    /// with `token`.
    pub(super) fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call.
        let rc = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Turns watching `fd` (added before) off or on again without taking it out: for a
    /// nested epoll set, adding it again would walk every descriptor in it (the kernel's loop
    /// check), changing its events does not.
    pub(super) fn set_watching(&self, fd: RawFd, token: u64, on: bool) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: if on { libc::EPOLLIN as u32 } else { 0 },
            u64: token,
        };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call.
        let rc = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, &mut ev) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Stops watching `fd`.
    pub(super) fn remove(&self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: as for `add` (kernels before 2.6.9 wanted a non-null event even here).
        let rc = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
        if rc != 0 {
            log::error!("epoll_ctl(DEL, {fd}): {}", io::Error::last_os_error());
        }
    }

    /// The tokens of the descriptors ready now (at most 64), without waiting (level-triggered:
    /// looking consumes nothing).
    pub(super) fn ready(&self, out: &mut Vec<u64>) {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
        // SAFETY: `evs` holds `evs.len()` writable events; a zero timeout never blocks.
        let n =
            unsafe { libc::epoll_wait(self.0.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, 0) };
        for ev in evs.iter().take(n.max(0) as usize) {
            out.push(ev.u64);
        }
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Writes `bufs` to the stream socket `fd` as one gather write, with MSG_NOSIGNAL: a write to a
/// connection the peer has closed or reset fails with EPIPE instead of raising SIGPIPE. A library
/// must never raise SIGPIPE in its host, whose default action kills the process; writev(2) (what
/// `Write::write_vectored` uses) has no such flag. Returns the bytes written.
pub(super) fn send_nosignal(fd: RawFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: msghdr is plain data; all-zero is a valid empty header (no name, no control).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is guaranteed ABI-compatible with struct iovec on Unix; the pointer and count
    // describe `bufs` exactly, and sendmsg only reads through them.
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len().min(libc::c_int::MAX as usize) as _;
    // SAFETY: `msg` points at `bufs.len()` valid iovecs that outlive the call; `fd` is a socket
    // the caller owns (a wrong fd only makes the call fail).
    let rc = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// Sends `head` followed by `len` bytes of this process's memory at `addr` to the stream
/// socket `fd` with one sendmsg(MSG_NOSIGNAL), without copying them into a buffer first.
/// Returns the bytes the socket took (of head and data together).
///
/// # Safety
/// As for `copy_from_registered`: `[addr, addr + len)` lies inside a live registration and the
/// caller holds the key registry lock for the duration of the call.
pub(super) unsafe fn send_registered(
    fd: RawFd,
    head: &[u8],
    addr: u64,
    len: usize,
) -> io::Result<usize> {
    let iov = [
        libc::iovec {
            iov_base: head.as_ptr() as *mut libc::c_void,
            iov_len: head.len(),
        },
        libc::iovec {
            iov_base: addr as usize as *mut libc::c_void,
            iov_len: len,
        },
    ];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = if len == 0 { 1 } else { 2 };
    // SAFETY: the iovecs describe `head` and a registered range the caller vouches for; sendmsg
    // only reads through them, during the call.
    let rc = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// Receives from the stream socket `fd` straight into `ranges` (address, length) of this
/// process's memory, in order, with one recvmsg; returns the bytes received (0: end of stream).
///
/// # Safety
/// Every range lies inside a live registration granting local write, and the caller holds the
/// key registry lock for the duration of the call.
pub(super) unsafe fn recv_registered(fd: RawFd, ranges: &[(u64, usize)]) -> io::Result<usize> {
    let iov: Vec<libc::iovec> = ranges
        .iter()
        .map(|&(addr, len)| libc::iovec {
            iov_base: addr as usize as *mut libc::c_void,
            iov_len: len,
        })
        .collect();
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: the iovecs describe registered ranges the caller vouches for (writable, live for
    // the call); recvmsg writes only through them.
    let rc = unsafe { libc::recvmsg(fd, &mut msg, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// Asks for a send buffer of `bytes` on socket `fd` (the kernel caps it at net.core.wmem_max).
pub(super) fn set_send_buffer(fd: RawFd, bytes: i32) -> io::Result<()> {
    // SAFETY: setsockopt reads exactly size_of::<c_int>() bytes from the pointer to `bytes`.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            &bytes as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// SO_LINGER on socket `fd`: with `abort`, closing it resets the connection at once (RST,
/// unsent data dropped); without, closing it sends what is queued and then the end of stream.
pub(super) fn set_abortive_close(fd: RawFd, abort: bool) -> io::Result<()> {
    let linger = libc::linger {
        l_onoff: abort as i32,
        l_linger: 0,
    };
    // SAFETY: setsockopt reads exactly size_of::<linger>() bytes from the pointer to `linger`.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Stops listening socket `fd` now: a poll() that waits on it holds the socket open until
/// it returns (the kernel keeps a reference to every file it polls), and until then its port
/// stays in LISTEN and a new listener on it fails with EADDRINUSE. Shut down, the socket
/// leaves LISTEN at once, and a SO_REUSEADDR listener may take the port.
pub(super) fn stop_listening(fd: RawFd) {
    // SAFETY: shutdown takes no pointer; on an fd that is not a socket it only fails.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// Sets the integer socket option `level`/`name` of socket `fd` to `value` (SO_KEEPALIVE,
/// TCP_KEEPIDLE, TCP_USER_TIMEOUT, ...).
pub(super) fn set_int_option(fd: RawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: setsockopt reads exactly size_of::<c_int>() bytes from the pointer to `value`.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the integer socket option `level`/`name` of socket `fd`.
pub(super) fn int_option(fd: RawFd, level: i32, name: i32) -> io::Result<i32> {
    let mut value: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` (the size of `value`) bytes through the pointer.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut value as *mut i32 as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// Test support: the descriptor of this process's TCP socket connected to local port `port`.
#[cfg(test)]
pub(super) fn socket_connected_to(port: u16) -> Option<RawFd> {
    let dir = std::fs::read_dir("/proc/self/fd").ok()?;
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<RawFd>().ok())
        .find(|&fd| {
            // SAFETY: sockaddr_in is plain data; getpeername writes at most `len` bytes into it.
            let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            // SAFETY: as above; `len` is addr's size.
            let rc = unsafe {
                libc::getpeername(fd, &mut addr as *mut _ as *mut libc::sockaddr, &mut len)
            };
            rc == 0
                && addr.sin_family == libc::AF_INET as libc::sa_family_t
                && u16::from_be(addr.sin_port) == port
        })
}

/// Test support: counts SIGPIPEs raised on the calling thread (a signal caused by a write is
/// delivered to the writing thread). Installs, once per process, a handler that counts instead
/// of the runtime's SIG_IGN, so a test can see whether code under test raised the signal.
#[cfg(test)]
pub(super) fn sigpipes_on_this_thread() -> u32 {
    use std::cell::Cell;
    use std::sync::Once;
    thread_local! {
        static SIGPIPES: Cell<u32> = const { Cell::new(0) };
    }
    extern "C" fn on_sigpipe(_: libc::c_int) {
        // A const-initialised thread-local Cell without destructor is a plain TLS slot: safe
        // to touch from a signal handler.
        SIGPIPES.with(|c| c.set(c.get() + 1));
    }
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: sigaction with a zeroed struct, an empty mask and a handler that only bumps a
        // thread-local counter (async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigpipe as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGPIPE, &sa, std::ptr::null_mut());
        }
    });
    SIGPIPES.with(|c| c.get())
}

/// The MTU of the interface holding `addr` (SIOCGIFMTU), if one does and can tell.
pub(super) fn interface_mtu(addr: Ipv4Addr) -> Option<u32> {
    let (name, _) = daplrs_backend::netif::ipv4_interfaces()
        .ok()?
        .into_iter()
        .find(|(_, a)| *a == addr)?;
    // SAFETY: plain data; all zeroes is a valid ifreq.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.to_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return None;
    }
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let sock = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    // SAFETY: a socket we own and an ifreq that lives across the call, NUL-terminated name.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &mut req) };
    // SAFETY: SIOCGIFMTU filled the union's mtu member.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    (rc == 0 && mtu > 0).then_some(mtu as u32)
}

/// Connects a TCP socket to `remote` within `limit`, with SO_REUSEADDR set before the connect.
///
/// Why: the side that closes a connection first keeps its local port in TIME_WAIT for a
/// minute, and the kernel refuses to bind a listener to a port held by a socket (or its
/// TIME_WAIT) that did not set SO_REUSEADDR, even though the listener sets it. Our outgoing
/// connections take ephemeral ports, and the fixed connection qualifiers of DAT programs
/// (dtest's 45248, say) lie inside the ephemeral range: after enough connections, one of our
/// own closed ones would make the next `dat_psp_create` on that port fail with
/// DAT_CONN_QUAL_IN_USE. With SO_REUSEADDR on both sockets the TIME_WAIT no longer conflicts
/// (a live listener still does).
pub fn connect_reusable(
    remote: std::net::SocketAddrV4,
    limit: std::time::Duration,
) -> io::Result<std::net::TcpStream> {
    let (stream, done) = connect_start(remote)?;
    if !done {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection timed out",
                ));
            }
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            let mut fds = [PollFd::new(stream.as_raw_fd(), POLLOUT)];
            if poll(&mut fds, ms)? > 0 {
                break;
            }
        }
        if let Some(err) = stream.take_error()? {
            return Err(err);
        }
    }
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// The first half of `connect_reusable`, for a caller that waits for it its own way: a
/// non-blocking socket whose connect to `remote` is under way (false: it is writable once
/// done, and `take_error` then says how it went) or already done (true).
pub(super) fn connect_start(
    remote: std::net::SocketAddrV4,
) -> io::Result<(std::net::TcpStream, bool)> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor we just created and nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    set_int_option(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    let stream = std::net::TcpStream::from(fd);
    stream.set_nonblocking(true)?;
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: remote.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*remote.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `sa` is a valid sockaddr_in of the length given.
    let rc = unsafe {
        libc::connect(
            stream.as_raw_fd(),
            &sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(err);
        }
        return Ok((stream, false));
    }
    Ok((stream, true))
}

/// Makes the calling thread SCHED_FIFO at the lowest real-time priority (`on`), or
/// SCHED_OTHER again. Needs CAP_SYS_NICE or an RLIMIT_RTPRIO of at least 1 for the first.
pub(super) fn set_realtime(on: bool) -> io::Result<()> {
    let (policy, priority) = match on {
        true => (libc::SCHED_FIFO, 1),
        false => (libc::SCHED_OTHER, 0),
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pthread_setschedparam(3) on our own thread, reading the one struct we pass.
    let rc = unsafe { libc::pthread_setschedparam(libc::pthread_self(), policy, &param) };
    match rc {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// `struct sched_attr` of sched_setattr(2), as far as its first version (56 bytes).
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// Asks the kernel for time slices of `slice` for the calling (ordinary, SCHED_OTHER)
/// thread, zero for its default: since Linux 6.12 a thread with a shorter slice than the one
/// running may preempt it when woken (EEVDF), and no privilege is needed. Older kernels
/// ignore the request or refuse it (then the thread keeps the default slice).
pub(super) fn set_time_slice(slice: std::time::Duration) -> io::Result<()> {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice: 0,
        priority: 0,
        runtime: slice.as_nanos() as u64,
        deadline: 0,
        period: 0,
    };
    // SAFETY: sched_setattr(2) on the calling thread (pid 0) reads the one struct we pass,
    // whose size it is told.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    match rc {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// How many times the calling thread has blocked (voluntary context switches).
pub(super) fn times_blocked() -> u64 {
    // SAFETY: getrusage(2) fills the one struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return 0;
    }
    ru.ru_nvcsw as u64
}
