//! Registered memory of one device: the key registry and every access to registered memory.
//!
//! Keys are `index << 8 | generation`. An index is unique among live registrations (memory
//! regions and windows), so no key is reused while its registration lives; a window's
//! generation changes with each bind, so a key from an earlier bind stops working.
//! Indexes and first generations are drawn at random (seeded from the kernel's getrandom), so a
//! peer that was never given a key cannot walk them: it has to guess one of 2^32 values, and a
//! wrong guess breaks its connection (REMOTE_ACCESS), so every guess costs a reconnect.
//! Every copy into or out of registered memory happens here, under the registry lock, after the
//! key, range, protection domain and access have been checked. Deregistration takes the same
//! lock, so once it returns no copy can touch the range.

use std::collections::{HashMap, HashSet};

use super::super::{access, Sge, WcStatus};
use super::sys;
use super::wire::Status;

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
}

impl KeyEntry {
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
    map: HashMap<u32, KeyEntry>,
    used_index: HashSet<u32>,
    next_index: u32,
    /// State of the generator indexes are drawn from (0: not seeded yet).
    rng: u64,
}

const MAX_INDEX: u32 = 0x00ff_ffff;

impl Keys {
    /// 32 unpredictable bits (splitmix64 over a getrandom seed). Not a cryptographic generator:
    /// what it protects is a key a guess gets one try at.
    pub fn random(&mut self) -> u32 {
        if self.rng == 0 {
            let mut seed = [0u8; 8];
            // SAFETY: writes at most 8 bytes into `seed`.
            let n = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), seed.len(), 0) };
            self.rng = if n == 8 {
                u64::from_ne_bytes(seed)
            } else {
                // No getrandom (very old kernel): the clock and our address still differ per
                // process and run.
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1);
                t ^ (self as *const Keys as u64)
            } | 1;
        }
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 32) as u32
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

    pub fn insert(&mut self, key: u32, e: KeyEntry) {
        self.map.insert(key, e);
    }

    pub fn remove(&mut self, key: u32) -> Option<KeyEntry> {
        self.map.remove(&key)
    }

    /// Removes every window bound into the region `region` (which is being deregistered).
    pub fn remove_windows_of(&mut self, region: u32) {
        self.map.retain(|_, e| !(e.window && e.region == region));
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

    /// Reads the bytes a local SGL describes.
    pub fn gather(&self, sgl: &[Sge], pd: u32) -> Result<Vec<u8>, WcStatus> {
        let total = self.check_local_sgl(sgl, pd, false)?;
        let mut out = vec![0u8; total as usize];
        let mut off = 0usize;
        for s in sgl {
            let n = s.length as usize;
            // SAFETY: check_local_sgl verified the segment lies inside a live registration of
            // this PD, and we hold the registry lock (see module docs).
            unsafe { sys::copy_from_registered(s.addr, &mut out[off..off + n]) };
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
            unsafe { sys::copy_to_registered(s.addr, &data[off..off + n]) };
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
        Ok(unsafe { sys::recv_registered(fd, &ranges) })
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
        if e.pd != pd || !e.covers(addr, len) || e.access & need == 0 {
            return Err(Status::RemoteAccess);
        }
        Ok(())
    }

    pub fn remote_write(&self, rkey: u32, addr: u64, pd: u32, data: &[u8]) -> Result<(), Status> {
        self.check_remote(rkey, addr, data.len() as u64, pd, access::REMOTE_WRITE)?;
        // SAFETY: check_remote verified [addr, addr+len) lies in a live registration with remote
        // write access, under the registry lock.
        unsafe { sys::copy_to_registered(addr, data) };
        Ok(())
    }

    /// A remote read answered straight from the registered memory: checks the access, then
    /// offers `head` and the bytes to the socket `fd` in one send (no copy of ours). Returns
    /// how many bytes (of head and data) the socket took and a copy of the data it did not,
    /// for the caller to queue.
    pub fn remote_read_to_socket(
        &self,
        rkey: u32,
        addr: u64,
        len: u32,
        pd: u32,
        fd: std::os::fd::RawFd,
        head: &[u8],
    ) -> Result<(usize, Vec<u8>), Status> {
        self.check_remote(rkey, addr, u64::from(len), pd, access::REMOTE_READ)?;
        // SAFETY: check_remote verified [addr, addr+len) lies in a live registration with
        // remote read access, and we hold the registry lock for the whole send.
        let sent = unsafe { sys::send_registered(fd, head, addr, len as usize) }.unwrap_or(0);
        // A failed send took nothing; the caller's next write meets the error again.
        let data_sent = sent.saturating_sub(head.len()).min(len as usize);
        // SAFETY: as above, for the tail of the same checked range.
        let rest =
            unsafe { sys::read_registered(addr + data_sent as u64, len as usize - data_sent) };
        Ok((sent, rest))
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
        Ok(unsafe { sys::atomic_registered(addr, operand, swap) })
    }

    pub fn remote_read(&self, rkey: u32, addr: u64, len: u32, pd: u32) -> Result<Vec<u8>, Status> {
        self.check_remote(rkey, addr, u64::from(len), pd, access::REMOTE_READ)?;
        // SAFETY: as in remote_write, with remote read access.
        Ok(unsafe { sys::read_registered(addr, len as usize) })
    }
}

#[cfg(test)]
mod tests {
    use super::Keys;

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
        let mut other = Keys::default();
        let theirs: Vec<u32> = (0..8).map(|_| other.alloc_index().unwrap()).collect();
        assert_ne!(
            theirs[..],
            issued[..8].iter().map(|k| k >> 8).collect::<Vec<_>>()[..]
        );
    }
}
