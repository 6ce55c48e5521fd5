//! Registered memory of one device: the key registry and every access to registered memory.
//!
//! Keys are `index << 8 | generation`. An index is unique among live registrations (memory
//! regions and windows), so no key is reused while its registration lives; a window's
//! generation changes with each bind, so a key from an earlier bind stops working.
//! Indexes and generations (the first, and each rebind's) are drawn from the kernel's getrandom,
//! so a peer cannot walk keys, nor predict a key from others it holds: it has to guess one of
//! 2^32 values, and a wrong guess breaks its connection (REMOTE_ACCESS), so every guess costs a
//! reconnect.
//! Every copy into or out of registered memory happens here, under the registry's read side
//! (read_mostly.rs: copies on different threads run at once), after the key, range,
//! protection domain and access have been checked. Deregistration takes its write side, so
//! once it returns no copy can touch the range.
//! The registry may also be published to same-host peers (samehost/): every change is then
//! made in the shared table too, under both locks, and a peer copies only under the table's
//! mutex, so the same holds for copies made by other processes.

use super::samehost::arena::ArenaSpan;
use super::samehost::Publisher;
use super::sys;
use super::wire::Status;
use daplrs_backend::intmap::{IntMap, IntSet};
use daplrs_backend::{access, Sge, WcStatus};
use std::io::IoSlice;

/// Remote reads up to a page are copied before their answer is sent (a few ns); longer ones
/// go out straight from the memory once each page was seen there (`remote_read_to_socket`).
const CHECKED_SEND_MAX: usize = 4096;

#[derive(Clone, Copy, Debug)]
pub(super) struct KeyEntry {
    pub addr: u64,
    pub len: u64,
    pub access: u32,
    pub pd: u32,
    /// Memory windows are remote-only keys.
    pub window: bool,
    /// The memory region's key: its own for a region, the one it is bound into for a window.
    pub region: u32,
    /// Where the key's memory lies in a memfd same-host peers may map (daplrs_backend::arena).
    pub arena: Option<ArenaSpan>,
}

impl KeyEntry {
    /// Whether this key lets a peer whose QP is in protection domain `pd` access
    /// `[addr, addr + len)` with privilege `need`: the target's rule, applied here to requests
    /// that arrive and by a same-host peer to the table we publish (samehost).
    pub(super) fn allows_remote(&self, addr: u64, len: u64, pd: u32, need: u32) -> bool {
        self.pd == pd && self.covers(addr, len) && self.access & need != 0
    }

    /// Whether a same-host peer may place a message into `[addr, addr + len)` of a receive
    /// posted with this key on a QP of protection domain `pd`: what our own scatter of it
    /// would check (`check_local` with write).
    pub(super) fn allows_local_write(&self, addr: u64, len: u64, pd: u32) -> bool {
        !self.window
            && self.pd == pd
            && self.access & access::LOCAL_WRITE != 0
            && self.covers(addr, len)
    }

    fn covers(&self, addr: u64, len: u64) -> bool {
        let Some(end) = self.addr.checked_add(self.len) else {
            return false;
        };
        match addr.checked_add(len) {
            Some(e) => addr >= self.addr && e <= end,
            None => false,
        }
    }
}

#[derive(Default)]
pub(super) struct Keys {
    map: IntMap<u32, KeyEntry>,
    /// The window keys bound into each region key, so that deregistering a region finds its
    /// windows without a scan of every key (a scan made freeing n regions cost n^2).
    windows: IntMap<u32, IntSet<u32>>,
    used_index: IntSet<u32>,
    next_index: u32,
    /// State of the fallback generator (0: not seeded yet); see [`Keys::random`].
    rng: u64,
    /// The same-host table this registry is mirrored in, if any.
    published: Option<Publisher>,
}

const MAX_INDEX: u32 = 0x00ff_ffff;

impl Keys {
    /// 32 unpredictable bits from the kernel's generator (getrandom), so that contexts a peer
    /// holds tell it nothing about the others. Where getrandom fails (a kernel before 3.17),
    /// splitmix64 seeded from the clock and an address: unpredictable to a remote peer that
    /// holds no context, not to one that holds several.
    pub fn random(&mut self) -> u32 {
        let mut bytes = [0u8; 4];
        // SAFETY: writes at most 4 bytes into `bytes`.
        let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
        if n == 4 {
            return u32::from_ne_bytes(bytes);
        }
        if self.rng == 0 {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1);
            self.rng = (t ^ (self as *const Keys as u64)) | 1;
        }
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 32) as u32
    }

    /// The key of a window's next bind after `current`: the same index, a random generation
    /// other than the current one (so the old key stops working and a peer that held it cannot
    /// predict the new one).
    pub fn next_generation(&mut self, current: u32) -> u32 {
        let step = 1 + self.random() % 255;
        (current & !0xff) | ((current + step) & 0xff)
    }

    /// The first key of a new registration with index `index`: a random generation.
    pub fn first_key(&mut self, index: u32) -> u32 {
        (index << 8) | (self.random() & 0xff)
    }

    /// A fresh index not used by any live registration, drawn at random.
    pub fn alloc_index(&mut self) -> Option<u32> {
        // Live registrations are few against 2^24 indexes: a random draw almost always hits
        // a free one; the scan below is for a registry that is nearly full.
        for _ in 0..64 {
            let index = self.random() & MAX_INDEX;
            if index != 0 && self.used_index.insert(index) {
                return Some(index);
            }
        }
        for _ in 0..=MAX_INDEX {
            self.next_index = if self.next_index >= MAX_INDEX {
                1
            } else {
                self.next_index + 1
            };
            if !self.used_index.contains(&self.next_index) {
                self.used_index.insert(self.next_index);
                return Some(self.next_index);
            }
        }
        None
    }

    pub fn free_index(&mut self, index: u32) {
        self.used_index.remove(&index);
    }

    /// A registry mirrored in the same-host table `published` writes.
    pub fn published_in(published: Option<Publisher>) -> Keys {
        Keys {
            published,
            ..Keys::default()
        }
    }

    pub fn insert(&mut self, key: u32, e: KeyEntry) {
        if let Some(old) = self.map.insert(key, e) {
            self.unindex(key, &old);
        }
        if e.window {
            self.windows.entry(e.region).or_default().insert(key);
        }
        if let Some(p) = self.published.as_mut() {
            p.set(key, &e);
        }
    }

    pub fn remove(&mut self, key: u32) -> Option<KeyEntry> {
        let old = self.map.remove(&key)?;
        self.unindex(key, &old);
        if let Some(p) = self.published.as_mut() {
            p.unset(key);
        }
        Some(old)
    }

    /// Forgets `key` (a window's) in the index of its region's windows.
    fn unindex(&mut self, key: u32, e: &KeyEntry) {
        if !e.window {
            return;
        }
        if let Some(set) = self.windows.get_mut(&e.region) {
            set.remove(&key);
            if set.is_empty() {
                self.windows.remove(&e.region);
            }
        }
    }

    /// Removes every window bound into the region `region` (which is being deregistered).
    pub fn remove_windows_of(&mut self, region: u32) {
        for key in self.windows.remove(&region).unwrap_or_default() {
            if self
                .map
                .get(&key)
                .is_some_and(|e| e.window && e.region == region)
            {
                self.map.remove(&key);
                if let Some(p) = self.published.as_mut() {
                    p.unset(key);
                }
            }
        }
    }

    /// Gives the region `region`, registered at `[addr, addr + len)`, the arena `span` (its
    /// memory just moved there), and each window bound into it the part it names. False if
    /// no such region is registered (any more).
    pub fn set_region_arena(&mut self, region: u32, addr: u64, len: u64, span: ArenaSpan) -> bool {
        match self.map.get(&region) {
            Some(e) if !e.window && e.addr == addr && e.len == len => {}
            _ => return false,
        }
        let windows: Vec<u32> = self
            .windows
            .get(&region)
            .map(|w| w.iter().copied().collect())
            .unwrap_or_default();
        for key in std::iter::once(region).chain(windows) {
            if let Some(mut e) = self.get(key) {
                e.arena = Some(span.advanced(e.addr - addr));
                self.insert(key, e);
            }
        }
        true
    }

    pub fn get(&self, key: u32) -> Option<KeyEntry> {
        self.map.get(&key).copied()
    }

    /// Checks a local segment: live region key (not a window), same PD, inside, and writable if
    /// `write`.
    fn check_local(&self, sge: &Sge, pd: u32, write: bool) -> Result<(), WcStatus> {
        if sge.length == 0 {
            return Ok(());
        }
        let e = self.map.get(&sge.lkey).ok_or(WcStatus::LocalProtection)?;
        if e.window || e.pd != pd || !e.covers(sge.addr, u64::from(sge.length)) {
            return Err(WcStatus::LocalProtection);
        }
        if write && e.access & access::LOCAL_WRITE == 0 {
            return Err(WcStatus::LocalProtection);
        }
        Ok(())
    }

    pub fn check_local_sgl(&self, sgl: &[Sge], pd: u32, write: bool) -> Result<u64, WcStatus> {
        let mut total = 0u64;
        for s in sgl {
            self.check_local(s, pd, write)?;
            total += u64::from(s.length);
        }
        Ok(total)
    }

    /// The ranges of a local SGL (checked as `check_local_sgl`; empty segments left out), for
    /// a same-host copy the caller makes while it holds this registry locked.
    pub fn local_ranges(&self, sgl: &[Sge], pd: u32, write: bool) -> Result<Ranges, WcStatus> {
        self.check_local_sgl(sgl, pd, write)?;
        let mut ranges = Ranges::default();
        for s in sgl.iter().filter(|s| s.length > 0) {
            ranges.push((s.addr, s.length as usize));
        }
        Ok(ranges)
    }

    /// Reads the bytes a local SGL describes.
    pub fn gather(&self, sgl: &[Sge], pd: u32) -> Result<Vec<u8>, WcStatus> {
        let total = self.check_local_sgl(sgl, pd, false)?;
        let mut out = vec![0u8; total as usize];
        let mut off = 0usize;
        for s in sgl {
            let n = s.length as usize;
            // SAFETY: check_local_sgl verified the segment lies inside a live registration of
            // this PD, and we hold the registry lock (see module docs).
            if !unsafe { sys::copy_from_registered(s.addr, &mut out[off..off + n]) } {
                return Err(WcStatus::LocalProtection); // unmapped since it was registered
            }
            off += n;
        }
        Ok(out)
    }

    /// Writes `data` into a local SGL, front segments first. LocalLength if it does not fit.
    pub fn scatter(&self, sgl: &[Sge], pd: u32, data: &[u8]) -> Result<(), WcStatus> {
        let total = self.check_local_sgl(sgl, pd, true)?;
        if (data.len() as u64) > total {
            return Err(WcStatus::LocalLength);
        }
        let mut off = 0usize;
        for s in sgl {
            if off >= data.len() {
                break;
            }
            let n = (s.length as usize).min(data.len() - off);
            // SAFETY: as in `gather`; the registration grants local write.
            if !unsafe { sys::copy_to_registered(s.addr, &data[off..off + n]) } {
                return Err(WcStatus::LocalProtection);
            }
            off += n;
        }
        Ok(())
    }

    /// Receives up to `max` bytes from the socket `fd` into a local SGL (checked for local
    /// write), starting `offset` bytes into it: an RDMA read's answer placed without an
    /// intermediate buffer. The inner result is the socket's (Ok(0): end of stream).
    pub fn recv_into_sgl(
        &self,
        sgl: &[Sge],
        pd: u32,
        offset: usize,
        max: usize,
        fd: std::os::fd::RawFd,
    ) -> Result<std::io::Result<usize>, WcStatus> {
        self.check_local_sgl(sgl, pd, true)?;
        let mut ranges = Vec::with_capacity(sgl.len());
        let (mut skip, mut left) = (offset, max);
        for s in sgl {
            let len = s.length as usize;
            if skip >= len {
                skip -= len;
                continue;
            }
            let n = (len - skip).min(left);
            if n > 0 {
                ranges.push((s.addr + skip as u64, n));
            }
            left -= n;
            skip = 0;
            if left == 0 {
                break;
            }
        }
        if ranges.is_empty() {
            return Err(WcStatus::LocalLength);
        }
        // SAFETY: check_local_sgl verified every segment lies inside a live registration of
        // this PD with local write, the ranges are sub-ranges of the segments, and we hold the
        // registry lock for the whole receive.
        match unsafe { sys::recv_registered(fd, &ranges) } {
            // Unmapped since it was registered: the kernel took nothing from the socket.
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => Err(WcStatus::LocalProtection),
            r => Ok(r),
        }
    }

    /// Target-side check of a remote access: live key, same PD as the target QP, range inside,
    /// privilege granted. Zero-length accesses need no key (as on RDMA NICs).
    fn check_remote(
        &self,
        rkey: u32,
        addr: u64,
        len: u64,
        pd: u32,
        need: u32,
    ) -> Result<(), Status> {
        if len == 0 {
            return Ok(());
        }
        let e = self.map.get(&rkey).ok_or(Status::RemoteAccess)?;
        if !e.allows_remote(addr, len, pd, need) {
            return Err(Status::RemoteAccess);
        }
        Ok(())
    }

    /// Part of a WRITE of `len` bytes to `addr`: `data`, `offset` bytes into it, checked as
    /// the whole write (each part: a region freed meanwhile refuses the rest).
    pub fn remote_write_part(
        &self,
        rkey: u32,
        addr: u64,
        len: u32,
        pd: u32,
        offset: usize,
        data: &[u8],
    ) -> Result<(), Status> {
        self.check_remote(rkey, addr, u64::from(len), pd, access::REMOTE_WRITE)?;
        if offset + data.len() > len as usize {
            return Err(Status::RemoteInvalid);
        }
        // SAFETY: check_remote verified the whole write lies in a live registration with remote
        // write access, under the registry lock; this part is inside it.
        match unsafe { sys::copy_to_registered(addr + offset as u64, data) } {
            true => Ok(()),
            false => Err(Status::RemoteAccess),
        }
    }

    /// Receives the rest of a WRITE of `len` bytes to `addr` from the socket `fd`, from
    /// `offset` on, straight into the memory (checked as `remote_write_part`). The inner
    /// result is the socket's (Ok(0): end of stream).
    pub fn recv_remote_write(
        &self,
        rkey: u32,
        addr: u64,
        len: u32,
        pd: u32,
        offset: usize,
        fd: std::os::fd::RawFd,
    ) -> Result<std::io::Result<usize>, WcStatus> {
        self.check_remote(rkey, addr, u64::from(len), pd, access::REMOTE_WRITE)
            .map_err(|_| WcStatus::RemoteAccess)?;
        let rest = (len as usize).saturating_sub(offset);
        // SAFETY: as in `remote_write_part`, for the rest of the checked range, under the
        // registry lock for the whole receive.
        match unsafe { sys::recv_registered(fd, &[(addr + offset as u64, rest)]) } {
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => Err(WcStatus::RemoteAccess),
            r => Ok(r),
        }
    }

    pub fn remote_write(&self, rkey: u32, addr: u64, pd: u32, data: &[u8]) -> Result<(), Status> {
        let len = u32::try_from(data.len()).map_err(|_| Status::RemoteInvalid)?;
        self.remote_write_part(rkey, addr, len, pd, 0, data)
    }

    /// A remote read answered straight from the registered memory: checks the access, then
    /// offers `head` and the bytes to the socket `fd` in one send (no copy of ours). Returns
    /// how many bytes (of head and data) the socket took and a copy of the data it did not,
    /// for the caller to queue. Err(Some(status)): refused, nothing sent; Err(None): the
    /// memory went away while part of the answer was out, and the connection must end.
    pub fn remote_read_to_socket(
        &self,
        rkey: u32,
        addr: u64,
        len: u32,
        pd: u32,
        fd: std::os::fd::RawFd,
        head: &[u8],
    ) -> Result<(usize, Vec<u8>), Option<Status>> {
        self.check_remote(rkey, addr, u64::from(len), pd, access::REMOTE_READ)
            .map_err(Some)?;
        let len = len as usize;
        if len <= CHECKED_SEND_MAX {
            // Copied first: an answer's header must not go out for bytes that are not there
            // (`guarded`).
            // SAFETY: as in `remote_read`.
            let data =
                unsafe { sys::read_registered(addr, len) }.ok_or(Some(Status::RemoteAccess))?;
            let sent =
                sys::send_nosignal(fd, &[IoSlice::new(head), IoSlice::new(&data)]).unwrap_or(0);
            let data_sent = sent.saturating_sub(head.len()).min(len);
            return Ok((sent, data[data_sent..].to_vec()));
        }
        // Sent straight from the memory, which must be there: once the header is out, only
        // the whole payload may follow it.
        // SAFETY: as below.
        if !unsafe { daplrs_backend::guarded::readable(addr, len) } {
            return Err(Some(Status::RemoteAccess));
        }
        // SAFETY: check_remote verified [addr, addr+len) lies in a live registration with
        // remote read access, and we hold the registry lock for the whole send.
        let sent = unsafe { sys::send_registered(fd, head, addr, len) }.unwrap_or(0);
        // A failed send took nothing; the caller's next write meets the error again.
        let data_sent = sent.saturating_sub(head.len()).min(len);
        // SAFETY: as above, for the tail of the same checked range.
        match unsafe { sys::read_registered(addr + data_sent as u64, len - data_sent) } {
            Some(rest) => Ok((sent, rest)),
            // Unmapped between the check and the copy, with the header out: the connection
            // must end (Err(None)), no other bytes may stand for the rest.
            None if sent > 0 => Err(None),
            None => Err(Some(Status::RemoteAccess)),
        }
    }

    /// A remote 64-bit atomic on the word at `addr`: fetch-and-add of `operand`, or, with
    /// `swap`, compare-and-swap (store `swap` if the word equals `operand`). Returns the word's
    /// previous value. The word must be naturally aligned (RemoteInvalid otherwise, as on an
    /// RDMA NIC) and the key must grant remote atomic access.
    pub fn remote_atomic(
        &self,
        rkey: u32,
        addr: u64,
        pd: u32,
        operand: u64,
        swap: Option<u64>,
    ) -> Result<u64, Status> {
        self.check_remote(rkey, addr, 8, pd, access::REMOTE_ATOMIC)?;
        if !addr.is_multiple_of(8) {
            return Err(Status::RemoteInvalid);
        }
        // SAFETY: check_remote verified the aligned 8 bytes at `addr` lie in a live
        // registration with remote atomic access, under the registry lock. The operation is a
        // CPU atomic, so it is atomic with respect to every other atomic on the word, from any
        // connection or thread of this process.
        unsafe { sys::atomic_registered(addr, operand, swap) }.ok_or(Status::RemoteAccess)
    }

    /// A remote read of `out.len()` bytes copied into `out`, allocating nothing (a signal
    /// handler's answer).
    pub fn remote_read_into(
        &self,
        rkey: u32,
        addr: u64,
        pd: u32,
        out: &mut [u8],
    ) -> Result<(), Status> {
        self.check_remote(rkey, addr, out.len() as u64, pd, access::REMOTE_READ)?;
        // SAFETY: as in remote_write, with remote read access.
        match unsafe { sys::copy_from_registered(addr, out) } {
            true => Ok(()),
            false => Err(Status::RemoteAccess),
        }
    }

    pub fn remote_read(&self, rkey: u32, addr: u64, len: u32, pd: u32) -> Result<Vec<u8>, Status> {
        self.check_remote(rkey, addr, u64::from(len), pd, access::REMOTE_READ)?;
        // SAFETY: as in remote_write, with remote read access.
        unsafe { sys::read_registered(addr, len as usize) }.ok_or(Status::RemoteAccess)
    }
}

/// A request's local segments as (address, length), empty ones left out: up to
/// `Ranges::INLINE` with no heap allocation (a DTO's path allocates nothing for the lists
/// programs use), more on the heap.
#[derive(Default)]
pub struct Ranges {
    len: usize,
    inline: [(u64, usize); Ranges::INLINE],
    heap: Vec<(u64, usize)>,
}

impl Ranges {
    pub const INLINE: usize = 4;

    pub(crate) fn push(&mut self, r: (u64, usize)) {
        if self.heap.is_empty() && self.len < Self::INLINE {
            self.inline[self.len] = r;
            self.len += 1;
            return;
        }
        if self.heap.is_empty() {
            self.heap.extend_from_slice(&self.inline[..self.len]);
        }
        self.heap.push(r);
    }
}

impl std::ops::Deref for Ranges {
    type Target = [(u64, usize)];
    fn deref(&self) -> &[(u64, usize)] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KeyEntry, Keys};

    fn entry(window: bool, region: u32) -> KeyEntry {
        KeyEntry {
            addr: 0x1000,
            len: 64,
            access: 0,
            pd: 1,
            window,
            region,
            arena: None,
        }
    }

    /// Deregistering a region removes exactly the windows bound into it (also after a rebind
    /// changed a window's key), found through the index rather than a scan of every key.
    #[test]
    fn windows_follow_their_region() {
        let mut keys = Keys::default();
        keys.insert(0x100, entry(false, 0x100));
        keys.insert(0x200, entry(false, 0x200));
        keys.insert(0x301, entry(true, 0x100));
        keys.insert(0x401, entry(true, 0x200));
        keys.remove(0x301);
        keys.insert(0x302, entry(true, 0x100));
        keys.remove(0x100);
        keys.remove_windows_of(0x100);
        assert!(keys.get(0x302).is_none());
        assert!(keys.get(0x401).is_some() && keys.get(0x200).is_some());
        keys.remove(0x200);
        keys.remove_windows_of(0x200);
        assert!(keys.get(0x401).is_none());
        assert!(keys.map.is_empty() && keys.windows.is_empty());
        // The regression: freeing n regions scanned every key each time (n^2: a million LMRs
        // took hours to free). Linear now: 200,000 regions come and go at once.
        for k in 1..=200_000u32 {
            keys.insert(k << 8, entry(false, k << 8));
        }
        for k in 1..=200_000u32 {
            keys.remove(k << 8);
            keys.remove_windows_of(k << 8);
        }
        assert!(keys.map.is_empty());
    }

    /// Keys a peer was not given cannot be walked: successive registrations get indexes and
    /// generations that are neither sequential nor repeated.
    #[test]
    fn keys_are_not_a_counter() {
        let mut keys = Keys::default();
        let issued: Vec<u32> = (0..1000)
            .map(|_| {
                let index = keys.alloc_index().expect("free index");
                keys.first_key(index)
            })
            .collect();
        let distinct: std::collections::HashSet<u32> = issued.iter().map(|k| k >> 8).collect();
        assert_eq!(
            distinct.len(),
            issued.len(),
            "an index was handed out twice"
        );
        let sequential = issued
            .windows(2)
            .filter(|w| (w[1] >> 8).wrapping_sub(w[0] >> 8) == 1)
            .count();
        assert!(
            sequential < 5,
            "{sequential} of 999 indexes follow their predecessor"
        );
        let low_zero = issued.iter().filter(|k| *k & 0xff == 0).count();
        assert!(low_zero < 50, "{low_zero} of 1000 first generations are 0");
        // A rebind keeps the index, never repeats the current generation, and does not step.
        let key = issued[0];
        let next: Vec<u32> = (0..200).map(|_| keys.next_generation(key)).collect();
        assert!(next.iter().all(|k| k >> 8 == key >> 8 && *k != key));
        let steps = next
            .iter()
            .filter(|k| **k == (key & !0xff) | ((key + 1) & 0xff));
        assert!(steps.count() < 10, "rebinds step the generation by one");
        let mut other = Keys::default();
        let theirs: Vec<u32> = (0..8).map(|_| other.alloc_index().unwrap()).collect();
        assert_ne!(
            theirs[..],
            issued[..8].iter().map(|k| k >> 8).collect::<Vec<_>>()[..]
        );
    }
}
