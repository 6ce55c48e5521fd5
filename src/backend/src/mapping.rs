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
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
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
/// Asked the cheapest way the kernel answers: PROCMAP_QUERY (Linux 6.11), else
/// MADV_POPULATE_READ/_WRITE (Linux 5.14), else the text of /proc/self/maps, which a
/// registration per message cannot afford (read and parsed whole each time: 1.4 ms a
/// `dat_lmr_create` of 4 KiB in the emulated guest's Linux 6.1, against 93 us for OFED's).
/// When the kernel cannot be asked at all (no /proc), true: registration works as before.
pub fn mapped(addr: u64, len: u64, write: bool) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let need = VMA_READ | if write { VMA_WRITE } else { 0 };
    if let Some(answer) = ask_procmap(addr, end, need) {
        return answer;
    }
    if let Some(answer) = ask_populate(addr, end, write) {
        return answer;
    }
    match std::fs::read_to_string("/proc/self/maps") {
        Ok(text) => covered(&text, addr, end, need),
        Err(_) => true,
    }
}

/// The kernel refused PROCMAP_QUERY once: it has none (before Linux 6.11).
static NO_PROCMAP: AtomicBool = AtomicBool::new(false);

/// `mapped` through PROCMAP_QUERY, a mapping at a time; None where the kernel has none.
fn ask_procmap(addr: u64, end: u64, need: u64) -> Option<bool> {
    static WATCH_FORKS: Once = Once::new();
    if NO_PROCMAP.load(Ordering::Relaxed) {
        return None;
    }
    // SAFETY: `forked` only bumps an atomic, which is async-signal-safe.
    WATCH_FORKS.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(forked));
    });
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
    }?;
    let answer = spans_cover(file, addr, end, need);
    if answer.is_none() {
        NO_PROCMAP.store(true, Ordering::Relaxed);
    }
    answer
}

/// Whether `[addr, addr + len)` is mapped throughout, readable and writable if `write`, in
/// the process whose /proc/<pid>/maps `maps` is (opened by the caller, who must be allowed
/// to read it). None where the kernel has no PROCMAP_QUERY (before Linux 6.11).
pub fn mapped_in(maps: &File, addr: u64, len: u64, write: bool) -> Option<bool> {
    let Some(end) = addr.checked_add(len) else {
        return Some(false);
    };
    let need = VMA_READ | if write { VMA_WRITE } else { 0 };
    spans_cover(maps, addr, end, need)
}

/// PROCMAP_QUERY mapping by mapping over `[addr, end)`; None where the kernel has none.
fn spans_cover(maps: &File, addr: u64, end: u64, need: u64) -> Option<bool> {
    let mut at = addr;
    while at < end {
        match vma_span_at(maps.as_raw_fd(), at) {
            Ok(Some((start, vma_end, flags))) if start <= at && flags & need == need => {
                at = vma_end;
            }
            Ok(_) => return Some(false),
            Err(_) => return None,
        }
    }
    Some(true)
}

/// Whether the kernel has MADV_POPULATE_READ/_WRITE (0 not known yet, 1 yes, 2 no).
static POPULATE: AtomicU32 = AtomicU32::new(0);

/// `mapped` by having the kernel fault the range in as a read (or a write) would, without
/// the access: what a verbs device's registration does to the pages anyway (it pins them,
/// for writing if asked). Yes on success, no where a page is not mapped (ENOMEM) or the
/// access would fault (EFAULT). None where the kernel cannot say: before Linux 5.14, and
/// EINVAL, which it gives alike for memory whose protection refuses the access (PROT_NONE,
/// read-only memory for a write) and for I/O and PFN mappings it does not populate; the
/// caller then reads the maps text (a refusal is the rare case).
fn ask_populate(addr: u64, end: u64, write: bool) -> Option<bool> {
    // SAFETY: no arguments, no memory.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    if POPULATE.load(Ordering::Relaxed) == 0 {
        // Asked once of memory that is surely there (this stack frame's page): EINVAL then
        // means the kernel does not know the advice.
        let here = &page as *const u64 as u64 & !(page - 1);
        // SAFETY: as below; our own stack, readable.
        let rc = unsafe {
            libc::madvise(
                here as usize as *mut libc::c_void,
                page as usize,
                libc::MADV_POPULATE_READ,
            )
        };
        POPULATE.store(if rc == 0 { 1 } else { 2 }, Ordering::Relaxed);
    }
    if POPULATE.load(Ordering::Relaxed) != 1 {
        return None;
    }
    let start = addr & !(page - 1);
    let stop = end.checked_next_multiple_of(page)?;
    let advice = if write {
        libc::MADV_POPULATE_WRITE
    } else {
        libc::MADV_POPULATE_READ
    };
    loop {
        // SAFETY: the advice faults pages in as an access would, and never writes to them;
        // an address we do not own is refused (ENOMEM), not touched.
        let rc = unsafe {
            libc::madvise(
                start as usize as *mut libc::c_void,
                (stop - start) as usize,
                advice,
            )
        };
        if rc == 0 {
            return Some(true);
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOMEM | libc::EFAULT) => return Some(false),
            Some(libc::EINTR) => continue,
            _ => return None,
        }
    }
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

    /// Where the next `anonymous` mapping is asked for: far below where the kernel places
    /// mappings (thread stacks, other tests' memory), a stretch of its own each time, so that
    /// a hole a test leaves is not filled by another test's thread before it looks (a
    /// fresh-clone run of make test-rust saw "all gone" fail so).
    static NEXT_AT: std::sync::atomic::AtomicU64 =
        std::sync::atomic::AtomicU64::new(0x3c00_0000_0000);

    fn anonymous(len: usize, prot: i32) -> u64 {
        let hint = NEXT_AT.fetch_add(1 << 30, Ordering::Relaxed);
        // SAFETY: a fresh anonymous mapping, at the hint if that is free (no MAP_FIXED: nothing
        // there is replaced); nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
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

    /// `mapped` through one way only (None: that way cannot say).
    type Way = fn(u64, u64, bool) -> Option<bool>;

    fn by_procmap(addr: u64, len: u64, write: bool) -> Option<bool> {
        let need = VMA_READ | if write { VMA_WRITE } else { 0 };
        match addr.checked_add(len) {
            Some(end) => ask_procmap(addr, end, need),
            None => Some(false),
        }
    }
    /// Where the advice cannot say (EINVAL: a refused protection), the maps text answers.
    fn by_populate(addr: u64, len: u64, write: bool) -> Option<bool> {
        let Some(end) = addr.checked_add(len) else {
            return Some(false);
        };
        if POPULATE.load(Ordering::Relaxed) == 2 {
            return None;
        }
        ask_populate(addr, end, write).or_else(|| by_text(addr, len, write))
    }
    fn by_text(addr: u64, len: u64, write: bool) -> Option<bool> {
        let need = VMA_READ | if write { VMA_WRITE } else { 0 };
        let end = addr.checked_add(len);
        let text = std::fs::read_to_string("/proc/self/maps").ok()?;
        Some(end.is_some_and(|end| covered(&text, addr, end, need)))
    }
    fn by_all(addr: u64, len: u64, write: bool) -> Option<bool> {
        Some(mapped(addr, len, write))
    }

    #[test]
    fn holes_and_protections_are_seen_every_way() {
        for (name, way) in [
            ("mapped", by_all as Way),
            ("PROCMAP_QUERY", by_procmap),
            ("MADV_POPULATE", by_populate),
            ("maps text", by_text),
        ] {
            // A kernel without that way (PROCMAP_QUERY before Linux 6.11) answers None.
            if way(&0u8 as *const u8 as u64, 1, false).is_none() {
                eprintln!("SKIP {name}: this kernel cannot answer that way");
                continue;
            }
            holes_and_protections(name, &|a, l, w| {
                way(a, l, w).unwrap_or_else(|| panic!("{name}: no answer for {a:#x}+{l} write {w}"))
            });
        }
    }

    fn holes_and_protections(way: &str, mapped: &dyn Fn(u64, u64, bool) -> bool) {
        // A range we unmapped may be mapped again by another test's thread before we
        // look (seen once in `make test-rust`): `mapped` is then right to see it.
        let gone = |addr: u64, len: u64| {
            !mapped(addr, len, false) || by_text(addr, len, false) == Some(true)
        };
        let page = 4096;
        let rw = anonymous(4 * page, libc::PROT_READ | libc::PROT_WRITE);
        assert!(mapped(rw, 4 * page as u64, true), "{way}");
        assert!(mapped(rw + 10, 100, true), "{way}");
        unmap(rw + 2 * page as u64, page);
        assert!(gone(rw, 4 * page as u64), "{way}: a hole in the middle");
        assert!(mapped(rw, 2 * page as u64, true), "{way}");
        assert!(gone(rw + 2 * page as u64, 1), "{way}");
        unmap(rw, 2 * page);
        unmap(rw + 3 * page as u64, page);
        assert!(gone(rw, 8), "{way}: all gone");

        let ro = anonymous(page, libc::PROT_READ);
        assert!(mapped(ro, page as u64, false), "{way}");
        assert!(
            !mapped(ro, page as u64, true),
            "{way}: read-only memory for writing"
        );
        unmap(ro, page);
        let none = anonymous(page, libc::PROT_NONE);
        assert!(!mapped(none, 8, false), "{way}");
        unmap(none, page);
        assert!(
            !mapped(u64::MAX - 4, 8, false),
            "{way}: past the end of the address space"
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
