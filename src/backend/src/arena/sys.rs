//! The system calls that move pages between private memory and an arena's memfd.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The kernel's userfaultfd ABI (linux/userfaultfd.h), for write-protecting a range while its
/// pages move into a memfd.
mod uffd {
    pub const API: u64 = 0xaa;
    /// UFFD_FEATURE_WP_HUGETLBFS_SHMEM: write protection of shared memory (Linux 5.19), which
    /// moving an arena's pages back needs.
    pub const FEATURE_WP_SHMEM: u64 = 1 << 12;
    pub const REGISTER_MODE_WP: u64 = 2;
    pub const WRITEPROTECT_MODE_WP: u64 = 1;

    #[repr(C)]
    pub struct Api {
        pub api: u64,
        pub features: u64,
        pub ioctls: u64,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct Range {
        pub start: u64,
        pub len: u64,
    }
    #[repr(C)]
    pub struct Register {
        pub range: Range,
        pub mode: u64,
        pub ioctls: u64,
    }
    #[repr(C)]
    pub struct WriteProtect {
        pub range: Range,
        pub mode: u64,
    }

    /// _IOWR(0xaa, nr, size).
    const fn iowr(nr: u64, size: usize) -> libc::c_ulong {
        ((3u64 << 30) | ((size as u64) << 16) | (0xaa << 8) | nr) as libc::c_ulong
    }
    pub const IOC_API: libc::c_ulong = iowr(0x3f, std::mem::size_of::<Api>());
    pub const IOC_REGISTER: libc::c_ulong = iowr(0x00, std::mem::size_of::<Register>());
    pub const IOC_WRITEPROTECT: libc::c_ulong = iowr(0x06, std::mem::size_of::<WriteProtect>());
    const _: () = assert!(IOC_API == 0xc018_aa3f && IOC_REGISTER == 0xc020_aa00);
    const _: () = assert!(IOC_WRITEPROTECT == 0xc018_aa06);
}

/// The page size (a power of two).
pub(super) fn page_size() -> u64 {
    // SAFETY: sysconf(3) reads a constant of the system.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// A userfaultfd, after the API handshake, that handles kernel faults too: a write the kernel
/// makes into the range for another thread (a read(2) into a buffer there) must wait like
/// a user write. Only a privileged process may have one (root, CAP_SYS_PTRACE) unless
/// vm.unprivileged_userfaultfd is 1; one for user faults only (UFFD_USER_MODE_ONLY) would fail
/// such a system call with EFAULT instead, so it is not used.
fn userfaultfd() -> io::Result<OwnedFd> {
    // SAFETY: userfaultfd(2); the descriptor is owned at once.
    let raw = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` was just created and nobody else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };
    // Asked for even when anonymous memory is protected: pages that cannot move back are not
    // moved in the first place.
    let mut api = uffd::Api {
        api: uffd::API,
        features: uffd::FEATURE_WP_SHMEM,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes the one struct we pass.
    if unsafe { libc::ioctl(fd.as_raw_fd(), uffd::IOC_API, &mut api) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Moves the pages `[start, start + len)` of this process into a new memfd (returned with its
/// inode, its size sealed) mapped MAP_SHARED at the same addresses, so that a peer can map
/// them too.
/// Their contents are kept, and so is every write another thread makes meanwhile (see
/// `while_write_protected`).
///
/// # Safety
/// `start` and `len` are page-aligned and, as just read in /proc/self/maps, name private
/// anonymous read-write memory of this process (registered memory: the application's).
pub(super) unsafe fn share_pages(start: u64, len: u64, name: &str) -> io::Result<(OwnedFd, u64)> {
    // Everything that can fail before the move: once the pages moved, the caller must get the
    // descriptor (to move them back).
    let fd = crate::memfile::create_sealed(name, len as usize)?;
    let ino = inode_of(fd.as_raw_fd())?;
    let memfd = fd.as_raw_fd();
    // SAFETY: the caller's range (see above).
    unsafe { while_write_protected(start, len, move || copy_and_map(memfd, start, len))? };
    Ok((fd, ino))
}

/// The reverse of `share_pages`: the pages `[start, start + len)`, a memfd's mapping, become
/// private anonymous memory again with the same contents (and every write made meanwhile).
///
/// # Safety
/// `start` and `len` are page-aligned and, as just read in /proc/self/maps, exactly the
/// mapping `share_pages` made (read-write, shared).
pub(super) unsafe fn unshare_pages(start: u64, len: u64) -> io::Result<()> {
    // SAFETY: a fresh private mapping chosen by the kernel.
    let private = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if private == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let private = private as u64;
    // SAFETY: the caller's range (see above).
    let moved =
        unsafe { while_write_protected(start, len, move || copy_and_move(private, start, len)) };
    if moved.is_err() {
        // SAFETY: our own fresh mapping (still there: copy_and_move moves it only on success).
        unsafe { libc::munmap(private as usize as *mut libc::c_void, len as usize) };
    }
    moved
}

/// Runs `change` (which replaces the mapping of `[start, start + len)` by one with the same
/// bytes) while the range is write-protected through a userfaultfd: a thread writing there
/// meanwhile waits (in the kernel) and then writes into what `change` left mapped, so no write
/// is lost. Without such a userfaultfd (see `userfaultfd`: no privilege, a seccomp filter, a
/// kernel without write protection of shared memory) nothing is done (an error).
///
/// The window runs on a thread of its own that writes only its own stack, so that any other
/// thread writing into the range meanwhile (the caller too: the range may hold its stack or
/// heap memory) waits instead of deadlocking us.
///
/// # Safety
/// `start` and `len` are page-aligned and name read-write memory of this process.
unsafe fn while_write_protected(
    start: u64,
    len: u64,
    change: impl FnOnce() -> io::Result<()> + Send + 'static,
) -> io::Result<()> {
    let uffd = userfaultfd()?;
    // Populate each page with an atomic no-op write (it keeps any concurrent store): the
    // write protection below covers present pages only.
    let page = page_size();
    let mut at = start;
    while at < start + len {
        // SAFETY: inside the caller's read-write range; an atomic access changes nothing.
        let word = unsafe { std::sync::atomic::AtomicU64::from_ptr(at as usize as *mut u64) };
        word.fetch_or(0, std::sync::atomic::Ordering::SeqCst);
        at += page;
    }
    on_mover_thread(Box::new(move || {
        let r = write_protect(uffd.as_raw_fd(), start, len).and_then(|()| change());
        // Closing the userfaultfd wakes every writer that waits: it writes again, into what
        // is mapped there now.
        drop(uffd);
        r
    }))
}

/// A move of pages, run by the mover thread.
type MoveJob = Box<dyn FnOnce() -> io::Result<()> + Send>;
type MoveRequest = (MoveJob, std::sync::mpsc::SyncSender<io::Result<()>>);

/// The process's mover thread (started with the first move; a new one in a forked child,
/// which has no threads but its forking one), by the pid it serves.
static MOVER: parking_lot::Mutex<Option<(u32, std::sync::mpsc::Sender<MoveRequest>)>> =
    parking_lot::Mutex::new(None);

/// Runs `job` on the mover thread and waits for it: a thread of ours that writes nothing but
/// its own stack while a range is write-protected (one started per move cost more than the
/// rest of the move).
fn on_mover_thread(job: MoveJob) -> io::Result<()> {
    let (done_tx, done_rx) = std::sync::mpsc::sync_channel(1);
    let mut mover = MOVER.lock();
    let pid = std::process::id();
    if mover.as_ref().is_none_or(|(p, _)| *p != pid) {
        let (tx, rx) = std::sync::mpsc::channel::<MoveRequest>();
        std::thread::Builder::new()
            .name("daplrs-mover".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                block_signals_here();
                for (job, done) in rx {
                    let _ = done.send(job());
                }
            })?;
        *mover = Some((pid, tx));
    }
    let sent = mover
        .as_ref()
        .is_some_and(|(_, tx)| tx.send((job, done_tx)).is_ok());
    if !sent {
        // It ended (a panic in a move: a bug); the next move starts another.
        *mover = None;
        return Err(io::Error::other("page mover thread gone"));
    }
    drop(mover);
    done_rx
        .recv()
        .map_err(|_| io::Error::other("page mover thread gone"))?
}

/// What the kernel says of one of our mappings (PROCMAP_QUERY).
pub(super) struct VmaInfo {
    pub start: u64,
    pub end: u64,
    /// VMA_* bits.
    pub flags: u64,
    pub offset: u64,
    pub ino: u64,
    /// "[heap]", a file's path, "" for anonymous memory.
    pub name: String,
}

use crate::mapping::{ProcmapQuery, PROCMAP_QUERY};
pub(super) use crate::mapping::{VMA_EXEC, VMA_READ, VMA_SHARED, VMA_WRITE};

/// The mapping of ours that contains `addr`, None if none does, asked of the kernel through
/// `maps` (our /proc/self/maps, open): one ioctl instead of reading the whole file, which
/// cost more than a move itself. Err on kernels before 6.11 (ENOTTY: read the file instead).
pub(super) fn vma_at(maps: RawFd, addr: u64) -> io::Result<Option<VmaInfo>> {
    let mut name = [0u8; 256];
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_addr: addr,
        vma_name_size: name.len() as u32,
        vma_name_addr: name.as_mut_ptr() as u64,
        ..ProcmapQuery::default()
    };
    // SAFETY: PROCMAP_QUERY reads and writes `q` and writes at most `name.len()` bytes into
    // `name`, both ours.
    if unsafe { libc::ioctl(maps, PROCMAP_QUERY, &mut q) } < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            // A name longer than ours: some file, not anything we move.
            Some(libc::ENAMETOOLONG) => Ok(Some(VmaInfo {
                start: addr,
                end: addr + 1,
                flags: 0,
                offset: 0,
                ino: u64::MAX,
                name: "?".into(),
            })),
            _ => Err(e),
        };
    }
    let n = (q.vma_name_size as usize).min(name.len());
    let text = &name[..n];
    let text = text.split(|&b| b == 0).next().unwrap_or_default();
    Ok(Some(VmaInfo {
        start: q.vma_start,
        end: q.vma_end,
        flags: q.vma_flags,
        offset: q.vma_offset,
        ino: q.inode,
        name: String::from_utf8_lossy(text).into_owned(),
    }))
}

/// Write-protects `[start, start + len)` through `uffd` (on the thread that then changes it).
fn write_protect(uffd: RawFd, start: u64, len: u64) -> io::Result<()> {
    let here = 0u8;
    let sp = &here as *const u8 as u64;
    if (start..start + len).contains(&sp) {
        // Our own stack inside the range: a write of ours would wait for ourselves.
        return Err(io::ErrorKind::WouldBlock.into());
    }
    let range = uffd::Range { start, len };
    let mut reg = uffd::Register {
        range,
        mode: uffd::REGISTER_MODE_WP,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_REGISTER reads and writes the struct we pass.
    if unsafe { libc::ioctl(uffd, uffd::IOC_REGISTER, &mut reg) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut wp = uffd::WriteProtect {
        range,
        mode: uffd::WRITEPROTECT_MODE_WP,
    };
    // SAFETY: UFFDIO_WRITEPROTECT reads the struct we pass.
    if unsafe { libc::ioctl(uffd, uffd::IOC_WRITEPROTECT, &mut wp) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `share_pages`' change, write-protected: copy the range into the memfd, map it over.
fn copy_and_map(memfd: RawFd, start: u64, len: u64) -> io::Result<()> {
    let mut done = 0u64;
    while done < len {
        // SAFETY: pwrite(2) reads `len - done` bytes of the range (readable: reads are not
        // write-protected) into the memfd.
        let n = unsafe {
            libc::pwrite(
                memfd,
                (start + done) as usize as *const libc::c_void,
                (len - done) as usize,
                done as libc::off_t,
            )
        };
        if n <= 0 {
            return Err(io::Error::last_os_error());
        }
        done += n as u64;
    }
    // SAFETY: replaces exactly the range (page-aligned, ours: see share_pages) with the
    // memfd, which now holds the same bytes.
    let p = unsafe {
        libc::mmap(
            start as usize as *mut libc::c_void,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            memfd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `unshare_pages`' change, write-protected: copy the range into the private mapping
/// `private`, then move that mapping over the range.
fn copy_and_move(private: u64, start: u64, len: u64) -> io::Result<()> {
    // SAFETY: reads the range (readable) into our fresh private mapping of `len` bytes,
    // which no other thread knows of.
    unsafe {
        std::ptr::copy_nonoverlapping(
            start as usize as *const u8,
            private as usize as *mut u8,
            len as usize,
        )
    };
    // SAFETY: moves our private mapping over exactly the range (see unshare_pages), which
    // it replaces.
    let p = unsafe {
        libc::mremap(
            private as usize as *mut libc::c_void,
            len as usize,
            len as usize,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            start as usize as *mut libc::c_void,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The inode number of a file we hold (what /proc/<pid>/maps shows for its mappings).
pub(super) fn inode_of(fd: RawFd) -> io::Result<u64> {
    crate::peer_fd::identity(fd).map(|(_, ino)| ino)
}

/// Blocks every signal a handler could catch on the calling thread (the mover), but the
/// faults a bug of ours would raise: a handler run here while a range is write-protected
/// and writing into it would wait for this very thread (rs-tcp's signal-driven service, for
/// one, writes registered memory).
fn block_signals_here() {
    // SAFETY: a sigset of ours, filled by sigfillset and trimmed by sigdelset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGABRT,
        ] {
            libc::sigdelset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}
