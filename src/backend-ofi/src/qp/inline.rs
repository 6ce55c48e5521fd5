//! RDMA requests to a peer on this host whose key table is mapped (`keymap`: shm, and
//! ofi_rxm between processes of one host): the small ones done by the initiator itself, with
//! a cross-memory attach between our segments and the peer's memory on the posting thread;
//! the others looked at first.
//!
//! The provider moves an RMA in the target process, when its progress thread runs. A target
//! spinning on its memory waited for the CPU it holds (half a millisecond an 8 B write on
//! shm, a millisecond on ofi_rxm), memory the target had unmapped since its registration
//! killed it with SIGSEGV inside shm's copy, and over tcp a read of it was never answered
//! (issue 41). Done here, the target's CPU is never needed, and a fault is the kernel's
//! EFAULT, completed as the remote access error an RDMA NIC reports. A request is done here
//! only when nothing of the QP's before it is still out (at the provider or awaiting a
//! receipt), so that its data is placed after theirs as DAT's order asks.
//!
//! Where the peer moved the key's memory into an arena (`arenas`), the copy is the CPU's,
//! through our mapping of it: no system call. A key copied through often otherwise is asked
//! for (`PeerArenas::copied`).
//!
//! What goes through shm (large reads, which shm moves faster with both CPUs copying;
//! requests behind others; atomics and writes with immediate data) is first checked against
//! the target's mappings (PROCMAP_QUERY on its /proc/<pid>/maps; before Linux 6.11 a read of
//! the range's first and last byte). Memory unmapped or made inaccessible then fails the
//! request here instead of the target; what is left is memory unmapped between that check and
//! shm's copy.

use super::*;

/// Segments of ours passed to one system call without allocating, for most requests.
const INLINE_IOVS: usize = 8;

/// The largest read done here (bytes). Larger ones go through shm, several in flight
/// copying on both CPUs: a 1 MiB read moved 25 GB/s there against 12 GB/s here. Writes of
/// any size are done here (as fast, and the target need not run).
const INLINE_READ_MAX: u64 = 4096;

impl OfiQp {
    /// Does `request` here, or fails it here if the target's memory is not there (`refused`
    /// has checked the peer's entry); its status, or None: the provider's request.
    pub(super) fn try_inline(&self, inner: &Inner, request: &Request) -> Option<WcStatus> {
        let peer = inner.peer_keys.as_ref()?;
        let (va, len) = match request.kind {
            Kind::Read { va, .. } | Kind::Write { va, .. } => (va, request.len),
            Kind::Atomic { va, .. } => (va, 8),
            _ => return None,
        };
        let writes = matches!(request.kind, Kind::Write { .. } | Kind::Atomic { .. });
        if len == 0 || !peer.cma_allowed() {
            return None;
        }
        let first = request.token.wrapping_sub(inner.sends.base) & TOKEN_MASK == 0;
        let here = match request.kind {
            Kind::Read { .. } => len <= INLINE_READ_MAX,
            Kind::Write { imm: None, .. } => true,
            _ => false,
        };
        let plain = matches!(
            request.kind,
            Kind::Read { .. } | Kind::Write { imm: None, .. }
        );
        if first && plain {
            // Through the peer's arena, reads of any size too: one copy, no segments.
            if let Some(done) = self.through_arena(inner, peer, request, va, writes) {
                return Some(done);
            }
        }
        if first && here {
            return self.transfer(peer, request, va, writes);
        }
        let there = match peer.memory_there(va, len, writes) {
            Some(there) => Ok(there),
            None => ends_readable(peer.pid, va, len),
        };
        match there {
            Ok(true) => None,
            Ok(false) => Some(WcStatus::RemoteAccess),
            Err(e) => {
                log::debug!("QP {}: the target's memory not looked at: {e}", self.num);
                peer.cma_refused();
                None
            }
        }
    }

    /// The read or write of `request` through our mapping of the peer's arena, where its
    /// key has one; None: by cross-memory attach (then counted, and the arena asked for
    /// once the key is copied through often).
    fn through_arena(
        &self,
        inner: &Inner,
        peer: &PeerKeys,
        request: &Request,
        va: u64,
        write: bool,
    ) -> Option<WcStatus> {
        let rkey = request.kind.rkey()?;
        let entry = inner.starts.get(&rkey).copied().flatten()?;
        let start = entry.start;
        let Some(span) = peer.span(rkey) else {
            if peer.arenas.copied(rkey, entry.length, request.len) {
                if let Some(dev) = self.dev.upgrade() {
                    dev.keys.ask(peer.token, rkey);
                    peer.ring_now();
                }
            }
            return None;
        };
        peer.arenas
            .copy(peer, span, va.checked_sub(start)?, &request.sgl, write)
    }

    /// The read or write of `request` between our segments and the peer's memory at `va`.
    fn transfer(
        &self,
        peer: &PeerKeys,
        request: &Request,
        va: u64,
        write: bool,
    ) -> Option<WcStatus> {
        let ours: Vec<libc::iovec>;
        let mut inline = [iovec(0, 0); INLINE_IOVS];
        let local = if request.sgl.len() <= INLINE_IOVS {
            for (v, s) in inline.iter_mut().zip(&request.sgl) {
                *v = iovec(s.addr, s.length as u64);
            }
            &inline[..request.sgl.len()]
        } else {
            ours = request
                .sgl
                .iter()
                .map(|s| iovec(s.addr, s.length as u64))
                .collect();
            &ours[..]
        };
        let remote = iovec(va, request.len);
        // SAFETY: the peer's memory is written or read by the kernel, which checks it; ours is
        // the consumer's registered segments (the core checked them against its LMRs), which
        // the kernel also checks (EFAULT, never a fault here).
        let n = unsafe {
            let (pid, lc, rc) = (peer.pid as libc::pid_t, local.len() as _, 1);
            if write {
                libc::process_vm_writev(pid, local.as_ptr(), lc, &remote, rc, 0)
            } else {
                libc::process_vm_readv(pid, local.as_ptr(), lc, &remote, rc, 0)
            }
        };
        if n >= 0 && n as u64 == request.len {
            return Some(WcStatus::Success);
        }
        let err = std::io::Error::last_os_error().raw_os_error();
        if n < 0 && err != Some(libc::EFAULT) {
            // Not allowed (ptrace policy), or the peer is gone: the provider's way says.
            log::debug!("QP {}: cross-memory attach refused: {err:?}", self.num);
            peer.cma_refused();
            return None;
        }
        // A fault, ours or the peer's: ours only if our segments are not there now.
        let ours_there = request
            .sgl
            .iter()
            .all(|s| daplrs_backend::mapping::mapped(s.addr, s.length as u64, !write));
        Some(if ours_there {
            WcStatus::RemoteAccess
        } else {
            WcStatus::LocalProtection
        })
    }
}

/// Whether the first and last byte of `[va, va + len)` in process `pid` can be read. Err:
/// the kernel does not let us look (ptrace policy, the process gone).
fn ends_readable(pid: u32, va: u64, len: u64) -> std::io::Result<bool> {
    let mut scratch = [0u8; 2];
    let local = iovec(scratch.as_mut_ptr() as u64, 2);
    let remote = [iovec(va, 1), iovec(va + len - 1, 1)];
    // SAFETY: `local` is our 2-byte scratch buffer; the kernel checks the peer's memory.
    let got =
        unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, remote.as_ptr(), 2, 0) };
    match got {
        2 => Ok(true),
        n if n >= 0 => Ok(false),
        _ => {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EFAULT) => Ok(false),
                _ => Err(e),
            }
        }
    }
}

fn iovec(addr: u64, len: u64) -> libc::iovec {
    libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len as usize,
    }
}
