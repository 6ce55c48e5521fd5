//! Registered memory a same-host peer maps, so that its RDMA reads and writes are plain
//! memory copies instead of system calls.
//!
//! Cross-memory attach (process_vm_readv, /proc/<pid>/mem) costs a system call and a page
//! walk per transfer: 1.1-1.9 us for 8 bytes on the machines we measure, whatever the copy.
//! A peer that maps the target's memory copies 8 bytes in nanoseconds. The application's
//! memory is its own private memory, which no other process can map; so a registered region
//! that peers copy through often has its pages moved into a memfd (an *arena*) mapped
//! MAP_SHARED at the same addresses (`sys::share_pages`: contents kept, and every write
//! another thread makes meanwhile too). The application sees the same memory at the same
//! addresses; a peer opens the memfd through /proc/<pid>/fd (the same ptrace check as for
//! the key table) and maps it.
//!
//! When: not at registration. Moving pages in and back costs hundreds of microseconds (4
//! KiB: about 150 in, 170 back; 1 MiB: 0.8 and 1.3 ms, measured here), where one transfer by
//! cross-memory attach costs a few: a message layer that registers a buffer for each message
//! (register, one RDMA write, free) paid the moves every message and ran at a tenth of TCP's
//! speed. A region starts served by cross-memory attach; a peer counts what that costs it per
//! key and, once it has cost about what the move would, asks the owner to move the region
//! (peer_table.rs `Heat`); the owner's keeper thread moves it (`share`, called by the device's
//! promoter) and publishes the arena in the region's key and its windows' keys. Memory
//! registered inside an arena that exists already (a sub-page buffer beside a long-lived
//! registration) is published with it at once (`existing`: no system call when there is
//! none, the usual case).
//!
//! The key table still decides every access: a peer copies only under the table's mutex,
//! after the same check as before (live key, PD, range, privilege); an arena only changes how
//! the bytes move. Each published key names its arena (descriptor, inode, and where its
//! first byte lies in the memfd); a peer checks the inode of what it opens.
//!
//! Which memory moves: whole pages of private anonymous read-write mappings (heap, mmap,
//! thread stacks; not the main stack, files, or memory shared already), or memory inside an
//! arena made before (a second registration of the same buffer). Anything else (a region
//! with a page in another's arena: two heap buffers side by side), and every failure, leaves
//! the region as it was, served by cross-memory attach as before.
//! What changes for the application, while the region is registered: the pages it touches
//! are MAP_SHARED memory of the memfd (a child forked meanwhile gets a private copy of them
//! at the fork, as of any private memory: `private_in_child`). When the last registration in an arena ends, its pages move back
//! to private memory. Nothing moves while the process has memory pinned (an RDMA NIC's
//! registrations: the NIC would keep the pages left behind). Moving pages
//! needs a userfaultfd that also holds back the kernel's writes (`sys::userfaultfd`: root,
//! CAP_SYS_PTRACE, or vm.unprivileged_userfaultfd=1); without one every region stays as it
//! was. DAPLRS_SAME_HOST_MAP=never turns arenas off.
//!
//! Lifetime: a registration holds its arena; with the last one the pages move back and the
//! descriptor closes (a peer's mapping keeps the memfd's copy until the peer drops it: it
//! drops those whose descriptor closed each time it maps another, and keeps at most a few:
//! peer_table.rs `PeerArenas`). A deregistration that meets a move in progress waits for it, and
//! returns with the pages private again.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once, Weak};

mod sys;

use crate::intmap::IntMap;

/// Log target.
const LOG: &str = "daplrs::arena";

/// What a key names of its arena: published in the key table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaSpan {
    /// Our descriptor of the memfd (the peer opens /proc/<pid>/fd/<fd>).
    pub fd: u32,
    /// Its inode: the peer checks that the descriptor still names this memfd.
    pub ino: u64,
    /// Where the key's first byte lies in the memfd.
    pub off: u64,
}

impl ArenaSpan {
    /// The span of a window (or sub-range) starting `delta` bytes into this one.
    pub fn advanced(self, delta: u64) -> ArenaSpan {
        ArenaSpan {
            off: self.off + delta,
            ..self
        }
    }
}

/// A memfd holding registered pages of ours, mapped at their addresses `[start, start +
/// len)`. Dropped with the last registration in it, it moves the pages back to private
/// memory.
pub struct Arena {
    fd: OwnedFd,
    ino: u64,
    start: u64,
    len: u64,
}

/// The memfd's name: how /proc/self/maps shows an arena's mapping ("/memfd:<name> (deleted)").
const NAME: &str = "daplrs-arena";
/// Arenas live at once at most: each splits the application's mappings (up to two more
/// entries against the process's map count, 65530 by default).
const MAX_ARENAS: usize = 4096;

/// Every live arena of the process (arenas are per process: two devices registering one
/// buffer share its arena). Its lock also serializes the moves of pages in and out. Nothing
/// drops an `Arc<Arena>` while holding it (the drop takes it).
static ARENAS: parking_lot::Mutex<Vec<Live>> = parking_lot::Mutex::new(Vec::new());

/// Every live arena's pages again, readable without a lock (start, length; 0: a free slot):
/// a forked child makes them private (`private_in_child`), where ARENAS may have been held by
/// another thread at the fork.
static FORK_COPIES: [[AtomicU64; 2]; MAX_ARENAS] =
    [const { [AtomicU64::new(0), AtomicU64::new(0)] }; MAX_ARENAS];

/// Notes an arena's pages for a forked child (`FORK_COPIES`).
fn note_for_fork(start: u64, len: u64) {
    static WATCH: Once = Once::new();
    // SAFETY: `private_in_child` makes only async-signal-safe calls (mmap, mremap, munmap)
    // and guarded copies.
    WATCH.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(private_in_child));
    });
    for slot in FORK_COPIES.iter() {
        if slot[0]
            .compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            slot[1].store(len, Ordering::Release);
            return;
        }
    }
}

fn forget_for_fork(start: u64) {
    for slot in FORK_COPIES.iter() {
        if slot[0].load(Ordering::Acquire) == start {
            slot[1].store(0, Ordering::Release);
            slot[0].store(0, Ordering::Release);
            return;
        }
    }
}

/// In a forked child: each arena's pages, shared with the parent (MAP_SHARED memory of the
/// memfd), are replaced by a private copy, so that the child's writes stay its own and the
/// parent's registered memory is the parent's, as for any private memory (and as the kernel
/// copies an RDMA NIC's pinned pages into a child at fork). One copy of every arena per fork.
extern "C" fn private_in_child() {
    for slot in FORK_COPIES.iter() {
        let (start, len) = (
            slot[0].load(Ordering::Acquire),
            slot[1].load(Ordering::Acquire) as usize,
        );
        if start == 0 || len == 0 {
            continue;
        }
        // SAFETY: a fresh private mapping of our own, filled by a guarded copy (the
        // application may have unmapped the range: then nothing changes), then moved over
        // the arena's range, which is this process's own mapping.
        unsafe {
            let copy = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if copy == libc::MAP_FAILED {
                continue;
            }
            let copied = crate::guarded::copy(copy as *mut u8, start as usize as *const u8, len);
            let moved = copied
                && libc::mremap(
                    copy,
                    len,
                    len,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    start as usize as *mut libc::c_void,
                ) != libc::MAP_FAILED;
            if !moved {
                libc::munmap(copy, len);
            }
        }
    }
}

/// An entry of ARENAS: the arena's inode and pages, readable without upgrading `arena` (an
/// upgrade may make the last reference, whose drop must not happen under the lock).
struct Live {
    ino: u64,
    start: u64,
    end: u64,
    arena: Weak<Arena>,
}

/// Whether DAPLRS_SAME_HOST_MAP lets registrations make arenas (auto, the default, or never).
pub fn enabled() -> bool {
    match std::env::var("DAPLRS_SAME_HOST_MAP")
        .as_deref()
        .map(str::trim)
    {
        Ok("never") => false,
        Ok("auto") | Ok("") | Err(_) => true,
        Ok(other) => {
            log::warn!(target: LOG, "DAPLRS_SAME_HOST_MAP={other:?}: not auto|never; using auto");
            true
        }
    }
}

/// One of our mappings: a line of /proc/self/maps, or the kernel's answer to a query.
#[derive(Debug, PartialEq, Eq)]
struct Vma {
    start: u64,
    end: u64,
    /// sys::VMA_* bits.
    flags: u64,
    offset: u64,
    ino: u64,
    /// "" for anonymous memory, "[heap]", a file's path.
    path: String,
}

const RW: u64 = sys::VMA_READ | sys::VMA_WRITE;
const KIND: u64 = RW | sys::VMA_EXEC | sys::VMA_SHARED;

impl Vma {
    /// Private anonymous read-write memory: what can become an arena.
    fn is_private_anonymous(&self) -> bool {
        self.flags & KIND == RW && self.ino == 0 && (self.path.is_empty() || self.path == "[heap]")
    }

    /// A mapping of one of our arenas.
    fn is_arena(&self) -> bool {
        self.flags & KIND == RW | sys::VMA_SHARED
            && self.path.starts_with("/memfd:")
            && self.path["/memfd:".len()..].split(' ').next() == Some(NAME)
    }
}

fn parse_line(line: &str) -> Option<Vma> {
    let mut f = line.splitn(6, ' ');
    let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
    let _dev = f.next()?;
    let ino = f.next()?.parse().ok()?;
    let path = f.next().unwrap_or("").trim_start();
    let (s, e) = range.split_once('-')?;
    let p = perms.as_bytes();
    let bit = |i: usize, c: u8, b: u64| if p.get(i) == Some(&c) { b } else { 0 };
    Some(Vma {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        flags: bit(0, b'r', sys::VMA_READ)
            | bit(1, b'w', sys::VMA_WRITE)
            | bit(2, b'x', sys::VMA_EXEC)
            | bit(3, b's', sys::VMA_SHARED),
        offset: u64::from_str_radix(offset, 16).ok()?,
        ino,
        path: path.to_string(),
    })
}

/// What `[start, end)` is, by the mappings that cover it.
#[derive(Debug, PartialEq, Eq)]
enum Cover {
    /// Private anonymous read-write memory throughout: can become an arena.
    Private,
    /// Inside one mapping of an arena: its inode, and the memfd offset of `start`.
    InArena { ino: u64, off: u64 },
    /// Anything else (a hole, a file, shared memory, the main stack, mixed kinds).
    Other,
}

/// Classifies `[start, end)` by `vmas`, our mappings in address order from the one that
/// contains `start` on (the walk stops at the first that is not what it needs).
fn classify(vmas: impl IntoIterator<Item = Vma>, start: u64, end: u64) -> Cover {
    let mut at = start;
    let mut private = true;
    for v in vmas {
        if v.end <= at {
            continue;
        }
        if v.start > at {
            return Cover::Other;
        }
        if v.is_arena() && v.start <= start && v.end >= end {
            return Cover::InArena {
                ino: v.ino,
                off: v.offset + (start - v.start),
            };
        }
        private &= v.is_private_anonymous();
        if !private {
            return Cover::Other;
        }
        at = v.end;
        if at >= end {
            return Cover::Private;
        }
    }
    Cover::Other
}

/// `classify` over the text of /proc/self/maps.
fn cover(maps: &str, start: u64, end: u64) -> Cover {
    classify(maps.lines().filter_map(parse_line), start, end)
}

/// What `[start, end)` is now: asked of the kernel mapping by mapping (PROCMAP_QUERY), or
/// read in /proc/self/maps where the kernel cannot be asked.
fn cover_now(start: u64, end: u64) -> Cover {
    let Ok(maps) = std::fs::File::open("/proc/self/maps") else {
        return Cover::Other;
    };
    let mut vmas = Vec::new();
    let mut at = start;
    while at < end {
        match sys::vma_at(maps.as_raw_fd(), at) {
            Ok(Some(v)) => {
                at = v.end.max(at + 1);
                vmas.push(Vma {
                    start: v.start,
                    end: v.end,
                    flags: v.flags,
                    offset: v.offset,
                    ino: v.ino,
                    path: v.name,
                });
            }
            Ok(None) => return Cover::Other,
            Err(_) => {
                let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
                return cover(&text, start, end);
            }
        }
    }
    classify(vmas, start, end)
}

/// The whole pages `[start, end)` of `[addr, addr + len)`; None if empty or past the end of
/// the address space.
fn pages_of(addr: u64, len: u64) -> Option<(u64, u64)> {
    let page = sys::page_size();
    let end = addr.checked_add(len)?.checked_add(page - 1)? & !(page - 1);
    (len > 0).then_some((addr & !(page - 1), end))
}

/// The live arena that already holds every page of `[addr, addr + len)` (memory inside a
/// region mapped before: a sub-page buffer beside a long-lived registration, a second
/// registration of the same buffer), with the span of `addr` in it: nothing moves. Without
/// a system call when no arena covers the range, the usual case: registration stays as cheap
/// as without arenas.
pub fn existing(addr: u64, len: u64) -> Option<(Arc<Arena>, ArenaSpan)> {
    let (start, end) = pages_of(addr, len)?;
    let found = ARENAS
        .lock()
        .iter()
        .find(|l| l.start <= start && end <= l.end)
        .and_then(|l| l.arena.upgrade());
    // The lock is released: dropping `arena` below (the mapping there is not this arena any
    // more) may move its pages back, which takes it.
    let arena = found?;
    match cover_now(start, end) {
        Cover::InArena { ino, off } if ino == arena.ino => {
            let span = arena.span(off + (addr - start));
            Some((arena, span))
        }
        _ => None,
    }
}

/// The arena holding a region `[addr, addr + len)`, made now if it can be (its pages move
/// into a new memfd): the arena (held by the registration) and the span its key publishes.
/// None: the region stays served by cross-memory attach. Moving costs hundreds of
/// microseconds, more for large regions: it is done for memory that peers use often (a
/// peer's request, peer_table.rs `Heat`), not at registration.
pub fn share(addr: u64, len: u64) -> Option<(Arc<Arena>, ArenaSpan)> {
    let (start, end) = pages_of(addr, len)?;
    let mut arenas = ARENAS.lock();
    arenas.retain(|l| l.arena.strong_count() > 0);
    let found = cover_now(start, end);
    log::debug!(target: LOG, "{addr:#x}+{len}: pages {start:#x}-{end:#x}: {found:?}");
    match found {
        Cover::InArena { ino, off } => {
            let arena = arenas.iter().find(|l| l.ino == ino)?.arena.upgrade()?;
            let span = arena.span(off + (addr - start));
            Some((arena, span))
        }
        Cover::Private if arenas.len() < MAX_ARENAS && !pinned_memory() => {
            // SAFETY: page-aligned, and private anonymous read-write memory as just read in
            // /proc/self/maps (see share_pages for what happens to writes meanwhile).
            let (fd, ino) = match unsafe { sys::share_pages(start, end - start, NAME) } {
                Ok(moved) => moved,
                Err(e) => {
                    log::debug!(target: LOG, "{addr:#x}+{len}: not shared ({e})");
                    return None;
                }
            };
            let arena = Arc::new(Arena {
                fd,
                ino,
                start,
                len: end - start,
            });
            arenas.push(Live {
                ino,
                start,
                end,
                arena: Arc::downgrade(&arena),
            });
            note_for_fork(start, end - start);
            let span = arena.span(addr - start);
            Some((arena, span))
        }
        _ => None,
    }
}

/// What cross-memory attach through a peer's keys has cost us, by key, in units of about a
/// microsecond (a system call, and each 8 KiB it copies more slowly than a copy through a
/// mapping would): a peer's, of the owner's keys. Once a key's memory has cost about what mapping it would (`worth_mapping`),
/// the peer is asked to map it into an arena (here), and asked again at each doubling
/// should a request be lost or not be met. Moving pages costs far more than a transfer: memory
/// registered for one message (a message layer's rendezvous) is never moved, memory used
/// again and again is.
#[derive(Default)]
pub struct Heat {
    spent: IntMap<u32, (u64, u64)>,
}

/// Keys whose cost is kept, at most: the count starts again past it.
const HEAT_KEYS: usize = 4096;

/// What mapping `len` bytes into an arena costs the owner, moving them in and back, in the
/// units of `Heat`: about 250 us, and 2 us a KiB (measured here: 4 KiB moved in and back in
/// 310 us, 1 MiB in 2.1 ms).
pub fn worth_mapping(len: u64) -> u64 {
    256 + len / 512
}

impl Heat {
    /// Counts a transfer of `bytes` through `key` (of `key_len` bytes) by cross-memory attach;
    /// true when the owner should now be asked to map the key's memory.
    pub fn add(&mut self, key: u32, key_len: u64, bytes: u64) -> bool {
        if self.spent.len() >= HEAT_KEYS && !self.spent.contains_key(&key) {
            self.spent.clear();
        }
        let (spent, ask_at) = self.spent.entry(key).or_insert((0, worth_mapping(key_len)));
        *spent += 1 + bytes / 8192;
        if *spent < *ask_at {
            return false;
        }
        *ask_at = ask_at.saturating_mul(2);
        true
    }
}

/// Whether the kernel counts memory of this process as pinned (/proc/self/status VmPin: an
/// RDMA NIC's memory registrations, io_uring's fixed buffers). Pinned pages must stay where
/// they are: a NIC would go on reading the pages a move left behind. Pages are moved only
/// while nothing is pinned.
fn pinned_memory() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .is_none_or(|kb| kb.trim().trim_end_matches("kB").trim() != "0")
}

impl Drop for Arena {
    /// The last registration in the arena ended: its pages become private memory again, so
    /// that the application's memory is as before once it deregistered (a later fork copies
    /// it; MADV_DONTNEED zeroes it, as allocators expect). Not when the application no longer
    /// has exactly this arena mapped there (it unmapped the memory, or changed part of it),
    /// nor while memory is pinned.
    fn drop(&mut self) {
        let _moves = ARENAS.lock();
        forget_for_fork(self.start);
        let end = self.start + self.len;
        let here = Cover::InArena {
            ino: self.ino,
            off: 0,
        };
        let still = cover_now(self.start, end) == here;
        if !still || pinned_memory() {
            log::debug!(target: LOG, "arena {:#x}-{end:#x}: left as it is", self.start);
            return;
        }
        // SAFETY: page-aligned, and exactly the mapping share_pages made, as just read.
        if let Err(e) = unsafe { sys::unshare_pages(self.start, self.len) } {
            log::debug!(target: LOG, "arena {:#x}-{end:#x}: stays shared ({e})", self.start);
        }
    }
}

/// Whether `[addr, addr + len)` is private anonymous memory now (no arena's): what a
/// deregistration leaves.
pub fn is_private(addr: u64, len: u64) -> bool {
    pages_of(addr, len).is_some_and(|(start, end)| cover_now(start, end) == Cover::Private)
}

impl Arena {
    fn span(&self, off: u64) -> ArenaSpan {
        ArenaSpan {
            fd: self.fd.as_raw_fd() as u32,
            ino: self.ino,
            off,
        }
    }
}

/// Test memory, for the backends' tests too.
pub mod test_pages {
    /// Page-aligned private memory of our own (a mapping of its own: no page shared with
    /// other memory), unmapped on drop.
    pub struct Pages {
        pub ptr: *mut u8,
        pub len: usize,
    }

    impl Pages {
        pub fn new(len: usize) -> Pages {
            // SAFETY: a fresh anonymous mapping.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            Pages { ptr: p.cast(), len }
        }
        pub fn addr(&self) -> u64 {
            self.ptr as u64
        }
    }

    impl Drop for Pages {
        fn drop(&mut self) {
            // SAFETY: our own mapping.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use super::test_pages::Pages;

    /// Another mapping of an arena's memfd, as a peer's.
    struct PeerView(*const u8, usize);

    impl PeerView {
        fn map(fd: i32, len: usize) -> PeerView {
            // SAFETY: a fresh shared mapping of the memfd, read only.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            PeerView(p.cast(), len)
        }

        fn byte(&self, at: usize) -> u8 {
            assert!(at < self.1);
            // SAFETY: inside the mapping; read once (another mapping writes it).
            unsafe { self.0.add(at).read_volatile() }
        }
    }

    impl Drop for PeerView {
        fn drop(&mut self) {
            // SAFETY: our mapping.
            unsafe { libc::munmap(self.0 as *mut libc::c_void, self.1) };
        }
    }

    #[test]
    fn maps_lines_parse() {
        let l =
            "7f0000001000-7f0000003000 rw-s 00002000 00:01 1234   /memfd:daplrs-arena (deleted)";
        let v = parse_line(l).unwrap();
        assert_eq!(
            (v.start, v.end, v.offset, v.ino),
            (0x7f00_0000_1000, 0x7f00_0000_3000, 0x2000, 1234)
        );
        assert_eq!(v.flags, RW | sys::VMA_SHARED);
        assert_eq!(v.path, "/memfd:daplrs-arena (deleted)");
        assert!(v.is_arena() && !v.is_private_anonymous());
        let anon = parse_line("55d0-56d0 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!(anon.path, "");
        assert!(anon.is_private_anonymous());
        let maps = "1000-3000 rw-p 00000000 00:00 0 [heap]\n3000-4000 rw-p 00000000 00:00 0\n\
                    4000-6000 rw-s 00001000 00:01 77 /memfd:daplrs-arena (deleted)\n\
                    6000-7000 r--p 00000000 08:01 99 /usr/lib/x\n";
        assert_eq!(cover(maps, 0x1000, 0x4000), Cover::Private);
        assert_eq!(
            cover(maps, 0x5000, 0x6000),
            Cover::InArena {
                ino: 77,
                off: 0x2000
            }
        );
        assert_eq!(cover(maps, 0x3000, 0x5000), Cover::Other, "mixed kinds");
        assert_eq!(cover(maps, 0x6000, 0x7000), Cover::Other, "a file");
        assert_eq!(cover(maps, 0x0000, 0x2000), Cover::Other, "a hole");
        assert_eq!(cover(maps, 0x6000, 0x8000), Cover::Other, "a hole after");
    }

    /// The kernel's answers (PROCMAP_QUERY) classify ranges as the maps file does.
    #[test]
    fn the_kernels_answer_and_the_maps_file_agree() {
        let page = sys::page_size();
        let mem = Pages::new(4 * page as usize);
        let (a, e) = (mem.addr(), mem.addr() + 4 * page);
        // SAFETY: our own mapping: its last page read-only, so it is two mappings.
        let ro = unsafe {
            libc::mprotect(
                mem.ptr.add(3 * page as usize).cast(),
                page as usize,
                libc::PROT_READ,
            )
        };
        assert_eq!(ro, 0);
        let (_arena, _) = share(a + page, 8).expect("an arena");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for (s, t, want) in [
            (a, a + page, Cover::Private),
            (
                a + page,
                a + 2 * page,
                Cover::InArena {
                    ino: _arena.ino,
                    off: 0,
                },
            ),
            (a, a + 2 * page, Cover::Other),
            (a + 2 * page, e, Cover::Other),
            (e + (1 << 40), e + (1 << 40) + page, Cover::Other),
        ] {
            assert_eq!(cover_now(s, t), want, "{s:#x}-{t:#x}");
            assert_eq!(cover(&maps, s, t), want, "{s:#x}-{t:#x} in the file");
        }
    }

    #[test]
    fn shared_pages_keep_their_bytes_and_a_peer_sees_them() {
        let page = sys::page_size() as usize;
        let mem = Pages::new(3 * page);
        for i in 0..mem.len {
            // SAFETY: inside our mapping.
            unsafe { *mem.ptr.add(i) = (i % 251) as u8 };
        }
        let addr = mem.addr() + page as u64 + 100;
        let (arena, span) = share(addr, 8).expect("arena made");
        assert_eq!(span.off, 100, "one page, the region's offset in it");
        for i in 0..mem.len {
            // SAFETY: inside our mapping.
            assert_eq!(unsafe { *mem.ptr.add(i) }, (i % 251) as u8, "byte {i} kept");
        }
        // The memfd holds the live bytes: a write by us shows in another mapping of it.
        let other = PeerView::map(arena.fd.as_raw_fd(), page);
        // SAFETY: inside our mapping.
        unsafe { *mem.ptr.add(page + 100) = 0xab };
        assert_eq!(other.byte(100), 0xab);
        // A second registration inside it shares the arena.
        let (again, span2) = share(addr + 4, 4).expect("same arena");
        assert!(Arc::ptr_eq(&arena, &again));
        assert_eq!(span2, span.advanced(4));
        // A range that is only partly an arena is left alone.
        assert!(share(mem.addr(), 2 * page as u64).is_none());
        // With the last registration the pages are private again, bytes kept.
        drop((arena, again, other));
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let end = mem.addr() + mem.len as u64;
        assert_eq!(cover(&maps, mem.addr(), end), Cover::Private);
        for i in 0..mem.len {
            let want = if i == page + 100 {
                0xab
            } else {
                (i % 251) as u8
            };
            // SAFETY: inside our mapping.
            assert_eq!(unsafe { *mem.ptr.add(i) }, want, "byte {i} kept");
        }
    }

    /// A thread storing into the pages while they move in (registration) and out (the last
    /// deregistration) loses no store.
    #[test]
    fn writes_made_while_pages_move_are_kept() {
        let page = sys::page_size() as usize;
        for _ in 0..20 {
            let mem = Pages::new(4 * page);
            let stop = Arc::new(AtomicBool::new(false));
            let base = mem.addr();
            let writer = {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    // SAFETY: the first word of each of the 4 pages, inside the mapping, which
                    // outlives this thread (joined below).
                    let word =
                        |p: usize| unsafe { &*((base as usize + p * page) as *const AtomicU64) };
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        // Plain stores of the count: a store lost in a move shows as a word
                        // behind the count.
                        for p in 0..4 {
                            word(p).store(n, Ordering::Relaxed);
                        }
                    }
                    n
                })
            };
            std::thread::sleep(std::time::Duration::from_millis(1));
            let shared = share(mem.addr(), mem.len as u64);
            assert!(shared.is_some());
            std::thread::sleep(std::time::Duration::from_millis(1));
            drop(shared);
            std::thread::sleep(std::time::Duration::from_millis(1));
            stop.store(true, Ordering::Relaxed);
            let n = writer.join().unwrap();
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
            assert_eq!(cover(&maps, base, base + mem.len as u64), Cover::Private);
            for p in 0..4 {
                // SAFETY: inside our mapping.
                let v = unsafe { &*((base as usize + p * page) as *const AtomicU64) };
                assert_eq!(v.load(Ordering::Relaxed), n, "page {p}: last store kept");
            }
        }
    }

    #[test]
    fn memory_of_other_kinds_is_not_moved() {
        // Read-only memory.
        let page = sys::page_size() as usize;
        let mem = Pages::new(page);
        assert_eq!(
            // SAFETY: our own mapping.
            unsafe { libc::mprotect(mem.ptr.cast(), page, libc::PROT_READ) },
            0
        );
        assert!(share(mem.addr(), 8).is_none());
        // The main thread's stack is not, but a test thread's stack is plain anonymous memory:
        // a buffer on it is shared (its thread keeps running on it).
        let on_stack = [7u8; 64];
        let r = share(on_stack.as_ptr() as u64, 64);
        assert_eq!(on_stack, [7u8; 64]);
        drop(r);
    }
}
