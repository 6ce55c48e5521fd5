//! Memory files shared with peer processes on the same host: a memfd of ours whose size is
//! sealed, and a peer's opened through /proc. rs-tcp's same-host path keeps its key table,
//! rings and board in them; the libfabric backend its key table on shm, which initiators read
//! before each RDMA request. The kernel's ptrace check on /proc/<pid>/fd decides who may open
//! a peer's file (the same user, as for cross-memory attach).

use std::ffi::CString;
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// Why a peer's file cannot be used.
pub type Refusal = String;

/// A new anonymous memory file of `len` bytes (zero-filled, allocated as touched), closed on
/// exec and open to sealing.
pub fn create(name: &str, len: usize) -> io::Result<OwnedFd> {
    let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: plain memfd_create(2) with a NUL-terminated name; the descriptor is owned at once.
    let raw =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` was just created and nobody else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate(2) on our own descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Seals the size of our memfd (made by `create`): nobody, not a peer holding it either, can
/// shrink it under a mapping (which would SIGBUS whoever reads).
pub fn seal_size(fd: &OwnedFd) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl(2) F_ADD_SEALS on our own descriptor.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new memory file of `len` bytes whose size nobody can change (`create`, `seal_size`):
/// what peers map.
pub fn create_sealed(name: &str, len: usize) -> io::Result<OwnedFd> {
    let fd = create(name, len)?;
    seal_size(&fd)?;
    Ok(fd)
}

/// Whether a peer's memfd cannot shrink (so our mapping of it stays backed).
pub fn size_sealed(fd: RawFd) -> bool {
    // SAFETY: fcntl(2) F_GET_SEALS on a descriptor we hold.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

/// Whether a peer's `pid` and `fd` (read from what it sent, so untrusted) can name a process
/// and one of its descriptors at all (pid_t and int are signed; pid 0 is no process).
pub fn is_process_and_descriptor(pid: u32, fd: u32) -> bool {
    pid != 0 && pid <= i32::MAX as u32 && fd <= i32::MAX as u32
}

/// `file`, a peer's descriptor opened or duplicated (`what` names it), if it is a memory file
/// whose size is sealed; with its metadata.
pub fn sealed(file: File, what: &str) -> Result<(File, Metadata), Refusal> {
    let meta = file.metadata().map_err(|e| format!("{what}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{what}: not a memory file"));
    }
    if !size_sealed(file.as_raw_fd()) {
        return Err(format!("{what}: size not sealed"));
    }
    Ok((file, meta))
}

/// Opens descriptor `fd` of process `pid` (through /proc: the kernel's ptrace check decides),
/// for reading and, if `write`, writing, if it is a memory file whose size is sealed
/// (`sealed`).
pub fn open_peer(pid: u32, fd: u32, write: bool) -> Result<(File, Metadata), Refusal> {
    if !is_process_and_descriptor(pid, fd) {
        return Err(format!("offer names pid {pid} fd {fd}"));
    }
    let path = format!("/proc/{pid}/fd/{fd}");
    // The peer may name any descriptor of its own (a device, a FIFO): look at what it is
    // through an O_PATH descriptor (opening that has no effect on what it names), and open
    // it for real only if it is a regular file (a memfd is one).
    let path_only = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(&path)
        .map_err(|e| format!("open {path}: {e}"))?;
    let kind = path_only.metadata().map_err(|e| format!("{path}: {e}"))?;
    if !kind.is_file() {
        return Err(format!("{path}: not a memory file"));
    }
    let reopen = format!("/proc/self/fd/{}", path_only.as_raw_fd());
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&reopen)
        .map_err(|e| format!("open {path}: {e}"))?;
    sealed(file, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_file_of_ours_opens_as_a_peers_and_an_unsealed_one_does_not() {
        let me = std::process::id();
        let sealed = create_sealed("memfile-test", 8192).unwrap();
        let (_, meta) = open_peer(me, sealed.as_raw_fd() as u32, false).unwrap();
        assert_eq!(meta.len(), 8192);
        let unsealed = create("memfile-test", 8192).unwrap();
        assert!(open_peer(me, unsealed.as_raw_fd() as u32, false).is_err());
        assert!(open_peer(0, 3, false).is_err());
        assert!(open_peer(me, u32::MAX, false).is_err());
    }
}
