//! Whether memory is there: a range of our address space mapped throughout with the access a
//! registration asks for, asked of the kernel mapping by mapping (PROCMAP_QUERY on our
//! /proc/self/maps, Linux 6.11; that file's text on older kernels). An RDMA device's
//! registration pins the pages and fails (EFAULT) on memory that is not mapped, or not
//! writable when write access is asked; dat_lmr_create (core/lmr.rs) asks this first on every
//! backend: rs-tcp pins nothing, and a device pins memory asked for reading only with the
//! kernel's FOLL_FORCE (so it would take PROT_NONE memory).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

use parking_lot::Mutex;

/// Our /proc/self/maps, open, with the number of forks before it was opened: after a fork the
/// child's copy of the descriptor still shows its parent's mappings, so it opens its own.
static MAPS: Mutex<Option<(u32, File)>> = Mutex::new(None);
/// Forks of this process so far (counted in the child: `forked`).
static FORKS: AtomicU32 = AtomicU32::new(0);

extern "C" fn forked() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Whether every byte of `[addr, addr + len)` is mapped readable, and writable if `write`.
/// When the kernel cannot be asked at all (no /proc), true: registration works as before.
pub fn mapped(addr: u64, len: u64, write: bool) -> bool {
    static WATCH_FORKS: Once = Once::new();
    // SAFETY: `forked` only bumps an atomic, which is async-signal-safe.
    WATCH_FORKS.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(forked));
    });
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let forks = FORKS.load(Ordering::Relaxed);
    // Not waited for: a fork while another thread held it leaves it held in the child.
    let mut cached = MAPS.try_lock();
    let own;
    let file = match cached.as_deref_mut() {
        Some(slot) => {
            if slot.as_ref().is_none_or(|(f, _)| *f != forks) {
                *slot = File::open("/proc/self/maps").ok().map(|file| (forks, file));
            }
            slot.as_ref().map(|(_, file)| file)
        }
        None => {
            own = File::open("/proc/self/maps").ok();
            own.as_ref()
        }
    };
    let Some(file) = file else {
        return true;
    };
    let need = VMA_READ | if write { VMA_WRITE } else { 0 };
    let mut at = addr;
    while at < end {
        match vma_span_at(file.as_raw_fd(), at) {
            Ok(Some((start, vma_end, flags))) if start <= at && flags & need == need => {
                at = vma_end;
            }
            Ok(_) => return false,
            Err(_) => {
                let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
                return covered(&text, addr, end, need);
            }
        }
    }
    true
}

/// `mapped` over the text of /proc/self/maps (lines in address order).
fn covered(maps: &str, start: u64, end: u64, need: u64) -> bool {
    let mut at = start;
    for line in maps.lines() {
        let Some((from, to, flags)) = parse_line(line) else {
            continue;
        };
        if to <= at {
            continue;
        }
        if from > at || flags & need != need {
            return false;
        }
        at = to;
        if at >= end {
            return true;
        }
    }
    at >= end
}

/// A line's range and VMA_* read/write bits.
fn parse_line(line: &str) -> Option<(u64, u64, u64)> {
    let mut fields = line.split(' ');
    let (range, perms) = (fields.next()?, fields.next()?.as_bytes());
    let (s, e) = range.split_once('-')?;
    let bit = |i: usize, c: u8, b: u64| if perms.get(i) == Some(&c) { b } else { 0 };
    Some((
        u64::from_str_radix(s, 16).ok()?,
        u64::from_str_radix(e, 16).ok()?,
        bit(0, b'r', VMA_READ) | bit(1, b'w', VMA_WRITE),
    ))
}

pub const VMA_READ: u64 = 1;
pub const VMA_WRITE: u64 = 2;
pub const VMA_EXEC: u64 = 4;
pub const VMA_SHARED: u64 = 8;

/// struct procmap_query (linux/fs.h, Linux 6.11).
#[repr(C)]
#[derive(Default)]
pub struct ProcmapQuery {
    pub size: u64,
    pub query_flags: u64,
    pub query_addr: u64,
    pub vma_start: u64,
    pub vma_end: u64,
    pub vma_flags: u64,
    pub vma_page_size: u64,
    pub vma_offset: u64,
    pub inode: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub vma_name_size: u32,
    pub build_id_size: u32,
    pub vma_name_addr: u64,
    pub build_id_addr: u64,
}
/// _IOWR('f', 17, struct procmap_query).
pub const PROCMAP_QUERY: libc::c_ulong = 0xc068_6611;
const _: () = assert!(std::mem::size_of::<ProcmapQuery>() == 0x68);

/// The span and VMA_* access bits of the mapping of ours that contains `addr`, None if none
/// does: `vma_at` without its name (so that no path is too long to answer).
fn vma_span_at(maps: RawFd, addr: u64) -> io::Result<Option<(u64, u64, u64)>> {
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_addr: addr,
        ..ProcmapQuery::default()
    };
    // SAFETY: PROCMAP_QUERY reads and writes `q` only (no name or build id asked for).
    if unsafe { libc::ioctl(maps, PROCMAP_QUERY, &mut q) } < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some((q.vma_start, q.vma_end, q.vma_flags)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anonymous(len: usize, prot: i32) -> u64 {
        // SAFETY: a fresh anonymous mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as u64
    }

    fn unmap(addr: u64, len: usize) {
        // SAFETY: a mapping `anonymous` made, that no reference points into.
        assert_eq!(unsafe { libc::munmap(addr as *mut libc::c_void, len) }, 0);
    }

    #[test]
    fn holes_and_protections_are_seen() {
        let page = 4096;
        let rw = anonymous(4 * page, libc::PROT_READ | libc::PROT_WRITE);
        assert!(mapped(rw, 4 * page as u64, true));
        assert!(mapped(rw + 10, 100, true));
        unmap(rw + 2 * page as u64, page);
        assert!(!mapped(rw, 4 * page as u64, false), "a hole in the middle");
        assert!(mapped(rw, 2 * page as u64, true));
        assert!(!mapped(rw + 2 * page as u64, 1, false));
        unmap(rw, 2 * page);
        unmap(rw + 3 * page as u64, page);
        assert!(!mapped(rw, 8, false), "all gone");

        let ro = anonymous(page, libc::PROT_READ);
        assert!(mapped(ro, page as u64, false));
        assert!(
            !mapped(ro, page as u64, true),
            "read-only memory for writing"
        );
        unmap(ro, page);
        let none = anonymous(page, libc::PROT_NONE);
        assert!(!mapped(none, 8, false));
        unmap(none, page);
        assert!(
            !mapped(u64::MAX - 4, 8, false),
            "past the end of the address space"
        );
    }

    #[test]
    fn the_maps_text_agrees() {
        let maps = "1000-3000 rw-p 00000000 00:00 0 \n3000-4000 r--p 00000000 00:00 0 \n5000-6000 rw-p 00000000 00:00 0   [heap]\n";
        let rw = VMA_READ | VMA_WRITE;
        assert!(covered(maps, 0x1000, 0x3000, rw));
        assert!(covered(maps, 0x2000, 0x4000, VMA_READ));
        assert!(!covered(maps, 0x2000, 0x4000, rw));
        assert!(!covered(maps, 0x3800, 0x5800, VMA_READ), "a hole");
        assert!(covered(maps, 0x5000, 0x6000, rw));
        assert!(!covered(maps, 0x5800, 0x6800, VMA_READ), "past the last");
    }
}
