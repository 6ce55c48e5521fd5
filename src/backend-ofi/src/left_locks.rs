//! Spin locks a killed peer left held in shm's shared memory.
//!
//! shm guards each endpoint's region with a spin lock in the region itself
//! (libfabric 1.17 to 1.19, `struct smr_region`): a sender holds its peer's
//! region's lock while it writes a command there, and an endpoint holds its
//! own while it progresses. A process killed holding one leaves it held, and
//! every later caller spins inside the provider forever: our send to the dead
//! peer (its progress held its own lock), or our CQ read when the dead peer
//! held ours in its post to us. A QP checks its peer's sign of life before
//! each request (`OfiQp::peer_gone`), but the peer may die after the check.
//!
//! A thread of the device ("daplrs-ofi-locks", started at the first
//! connection on shm) looks at the signs of life of the connected peers
//! every `TICK`. Once a peer reads gone, its region's lock and our region on
//! that connection become suspects. At each look the thread tries to take a
//! suspect for up to `PROBE` (and lets go at once): taken once, it is cleared,
//! as a dead holder never lets go; a live holder's hold lasts microseconds,
//! and the lock is free between holds, waiters or not. One never taken for
//! `STUCK` is released, ours only if no dead peer's lock was released
//! meanwhile (a thread of ours holding ours might have waited on that one:
//! 1.17 never does, a later shm might). Reading the word would not do:
//! shm's progress runs only when signalled, so ours can be left held while
//! our progress thread turns, and under contention the word reads held
//! nearly always.
//!
//! Releasing is `pthread_spin_unlock` on the word (glibc's encoding is not
//! the same on every architecture); what the dead holder left half done in
//! the region is the dead connection's (its requests are flushed at its end).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use daplrs_backend::shared_map::SharedMap;
use parking_lot::Mutex;

use crate::keymap::PeerKeys;

/// How often the thread looks.
const TICK: Duration = Duration::from_millis(100);
/// How long a suspect lock must stay held, at every look, to be released.
const STUCK: Duration = Duration::from_secs(1);
/// How long a look tries to take a suspect.
const PROBE: Duration = Duration::from_micros(200);
/// The region layouts whose lock lies at `LOCK_AT` (`SMR_VERSION`: 4 in
/// libfabric 1.17 and 1.18, 5 in 1.19; 1.20 moved it).
const VERSIONS: [u8; 2] = [4, 5];
/// The offset of the lock in the region: after the version (1), a reserved
/// byte, flags (2), the pid (4), the CMA capabilities (2 and 2 of padding),
/// `max_sar_buf_per_peer` (4) and `base_addr` (8).
const LOCK_AT: usize = 24;
/// What we map of a region: its header.
const HEADER: usize = 4096;

/// The device's watch over shm's locks (inert on other providers).
pub(crate) struct LeftLocks {
    me: Weak<LeftLocks>,
    enabled: bool,
    peers: Mutex<HashMap<(String, String), Weak<PeerKeys>>>,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl LeftLocks {
    /// `shm`: the device's provider is shm (elsewhere nothing is watched).
    pub(crate) fn new(shm: bool) -> Arc<LeftLocks> {
        Arc::new_cyclic(|me| LeftLocks {
            me: me.clone(),
            enabled: shm,
            peers: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        })
    }

    /// A connection from our endpoint `own` (its fabric address) to the
    /// endpoint `peer` of the process whose sign of life `keys` is (None:
    /// not mapped here, so its death is not seen and nothing is watched).
    pub(crate) fn watch(&self, own: &[u8], peer: &[u8], keys: Option<&Arc<PeerKeys>>) {
        let (Some(keys), true) = (keys, self.enabled) else {
            return;
        };
        let (Some(own), Some(peer)) = (region_name(own), region_name(peer)) else {
            return;
        };
        // Entries whose table is no longer held are dropped by the thread's looks
        // (`newly_gone`), not here: a retain per connection made N connections cost N².
        self.peers.lock().insert((own, peer), Arc::downgrade(keys));
        let mut thread = self.thread.lock();
        if thread.is_none() && !self.stop.load(Ordering::Acquire) {
            let me = self.me.clone();
            match std::thread::Builder::new()
                .name("daplrs-ofi-locks".into())
                .spawn(move || run(me))
            {
                Ok(t) => *thread = Some(t),
                Err(e) => log::warn!("shm's left locks not watched: {e}"),
            }
        }
    }

    /// Ends the thread (the device's close).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }

    /// The regions of peers that read gone since the last look, each with
    /// ours on its connections; their entries are forgotten.
    fn newly_gone(&self) -> Vec<(String, String)> {
        let mut gone = Vec::new();
        self.peers.lock().retain(|names, w| match w.upgrade() {
            None => false,
            Some(keys) if keys.gone() => {
                gone.push(names.clone());
                false
            }
            Some(_) => true,
        });
        gone
    }
}

fn run(me: Weak<LeftLocks>) {
    let mut suspects: Vec<Suspect> = Vec::new();
    loop {
        std::thread::park_timeout(TICK);
        let Some(locks) = me.upgrade() else { return };
        if locks.stop.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        for (own, peer) in locks.newly_gone() {
            for (name, ours) in [(peer, false), (own, true)] {
                if suspects.iter().any(|s| s.name == name) {
                    continue;
                }
                if let Some(region) = Region::open(&name) {
                    suspects.push(Suspect::new(name, region, ours, now));
                }
            }
        }
        let mut peers_released = false;
        suspects.retain_mut(|s| match s.look(now) {
            Verdict::Watch => true,
            Verdict::Cleared => false,
            Verdict::Released => {
                peers_released |= !s.ours;
                false
            }
        });
        if peers_released {
            // Ours may have been held by a thread of ours waiting on the lock just released
            // (1.17 never waits so, holding one, but a later shm might): looked at afresh.
            for s in suspects.iter_mut().filter(|s| s.ours) {
                s.held = None;
            }
        }
    }
}

#[derive(PartialEq, Debug)]
enum Verdict {
    Watch,
    /// Read free: not held by the dead.
    Cleared,
    Released,
}

/// A lock a dead peer may hold.
struct Suspect {
    name: String,
    region: Region,
    /// Our endpoint's region (a live peer's send takes its lock too).
    ours: bool,
    /// Looks start a tick after the death was read: a thread of the killed
    /// process may still have been on its way out.
    from: Instant,
    /// Since when it stayed held at every look.
    held: Option<Instant>,
}

impl Suspect {
    fn new(name: String, region: Region, ours: bool, now: Instant) -> Suspect {
        Suspect {
            name,
            region,
            ours,
            from: now + TICK,
            held: None,
        }
    }

    fn look(&mut self, now: Instant) -> Verdict {
        if now < self.from {
            return Verdict::Watch;
        }
        if self.region.taken_within(PROBE) {
            return Verdict::Cleared;
        }
        let since = *self.held.get_or_insert(now);
        if now.duration_since(since) < STUCK {
            return Verdict::Watch;
        }
        log::warn!(
            "shm region {}: its lock held for {:?} after a peer's death: released",
            self.name,
            now.duration_since(since)
        );
        self.region.release();
        Verdict::Released
    }
}

/// The file name of the region behind a fabric address ("fi_shm://<name>").
fn region_name(address: &[u8]) -> Option<String> {
    let end = address
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(address.len());
    let s = std::str::from_utf8(&address[..end]).ok()?;
    let name = s.split_once("://").map_or(s, |(_, n)| n);
    let fits = !name.is_empty() && !name.contains('/') && name.len() < 256;
    fits.then(|| name.to_string())
}

/// A region's header, mapped on its own (the provider's mapping is its).
struct Region(SharedMap);

impl Region {
    /// Maps `/dev/shm/<name>` if its layout is one we know.
    fn open(name: &str) -> Option<Region> {
        let region = Region::map(name)?;
        // The header's first byte, read once (another process's).
        let version = region.0.read_u8(0);
        if !VERSIONS.contains(&version) {
            log::warn!("shm region {name}: layout {version} not known: its lock not watched");
            return None;
        }
        Some(region)
    }

    fn map(name: &str) -> Option<Region> {
        let path = std::ffi::CString::new(name).ok()?;
        // SAFETY: a NUL-terminated name; the descriptor is owned below and closed on drop.
        let fd = unsafe { libc::shm_open(path.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            log::debug!("shm region {name}: {}", std::io::Error::last_os_error());
            return None;
        }
        // SAFETY: a descriptor just opened, ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        SharedMap::map(fd.as_raw_fd(), HEADER).ok().map(Region)
    }

    fn word(&self) -> &AtomicI32 {
        self.0.atomic_i32(LOCK_AT)
    }

    #[cfg(test)]
    fn held(&self) -> bool {
        self.word().load(Ordering::Acquire) != unlocked()
    }

    /// Whether the lock could be taken (and was let go at once) within `probe`.
    fn taken_within(&self, probe: Duration) -> bool {
        let word = self.word().as_ptr().cast::<libc::pthread_spinlock_t>();
        let start = Instant::now();
        loop {
            // SAFETY: the lock word of the region; held for no more than these two calls.
            if unsafe { libc::pthread_spin_trylock(word) } == 0 {
                // SAFETY: taken just now by us.
                unsafe { libc::pthread_spin_unlock(word) };
                return true;
            }
            if start.elapsed() >= probe {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    fn release(&self) {
        // SAFETY: the lock word of the region, a pthread_spinlock_t.
        unsafe { libc::pthread_spin_unlock(self.word().as_ptr().cast()) };
    }
}

/// What a free spin lock's word reads (1 on x86-64's glibc, 0 elsewhere).
#[cfg(test)]
fn unlocked() -> i32 {
    static UNLOCKED: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *UNLOCKED.get_or_init(|| {
        let mut word: libc::pthread_spinlock_t = 0;
        // SAFETY: a local word.
        unsafe { libc::pthread_spin_init(&mut word, libc::PTHREAD_PROCESS_SHARED) };
        word
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_name_is_the_address_without_its_scheme() {
        assert_eq!(
            region_name(b"fi_shm://41:0:2\0\0").as_deref(),
            Some("41:0:2")
        );
        assert_eq!(region_name(b"41:0:2").as_deref(), Some("41:0:2"));
        assert_eq!(region_name(b"fi_shm://a/b"), None);
        assert_eq!(region_name(b"\0"), None);
    }

    /// A file like a region of layout `version`, its lock free; removed on drop.
    struct TestFile(std::ffi::CString);

    impl TestFile {
        fn new(tag: &str, version: u8) -> (TestFile, String) {
            let name = format!("daplrs-left-locks-{tag}-{}", std::process::id());
            let path = std::ffi::CString::new(name.clone()).unwrap();
            // SAFETY: creating and sizing a file of ours.
            unsafe {
                let fd = libc::shm_open(path.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600);
                assert!(fd >= 0);
                assert_eq!(libc::ftruncate(fd, HEADER as i64), 0);
                libc::close(fd);
            }
            let raw = Region::map(&name).unwrap();
            raw.0.write_u8(0, version);
            // SAFETY: the lock word of our file, used by nobody yet.
            unsafe {
                libc::pthread_spin_init(raw.word().as_ptr().cast(), libc::PTHREAD_PROCESS_SHARED);
            }
            (TestFile(path), name)
        }
    }

    impl Drop for TestFile {
        fn drop(&mut self) {
            // SAFETY: our file.
            unsafe { libc::shm_unlink(self.0.as_ptr()) };
        }
    }

    fn lock(region: &Region) {
        // SAFETY: the lock word of our file.
        let rc = unsafe { libc::pthread_spin_lock(region.word().as_ptr().cast()) };
        assert_eq!(rc, 0);
    }

    /// A lock left held (as by a killed holder) reads held, and free once released.
    #[test]
    fn a_left_lock_reads_held_and_is_released() {
        let (_unknown, name) = TestFile::new("unknown", 9);
        assert!(Region::open(&name).is_none(), "layout 9 is not known");
        let (_file, name) = TestFile::new("held", 4);
        let region = Region::open(&name).expect("layout 4");
        assert!(!region.held());
        lock(&region);
        assert!(region.held());
        region.release();
        assert!(!region.held());
        // SAFETY: taken again now that it was released.
        unsafe { assert_eq!(libc::pthread_spin_trylock(region.word().as_ptr().cast()), 0) };
    }

    /// A lock held at every look for `STUCK` is released; one free at a look is left alone.
    #[test]
    fn a_suspect_is_released_only_after_staying_held() {
        let t0 = Instant::now();
        let start = t0 + TICK;
        let (_f, name) = TestFile::new("peer", 4);
        let peer = Region::open(&name).unwrap();
        lock(&peer);
        let mut s = Suspect::new(name.clone(), peer, false, t0);
        assert_eq!(s.look(t0), Verdict::Watch, "not before a tick");
        assert_eq!(s.look(start), Verdict::Watch);
        assert_eq!(s.look(start + STUCK / 2), Verdict::Watch);
        assert!(s.region.held());
        assert_eq!(s.look(start + STUCK), Verdict::Released);
        assert!(!s.region.held(), "released");

        let mut free = Suspect::new(name, Region::open(&s.name).unwrap(), true, t0);
        assert_eq!(
            free.look(start),
            Verdict::Cleared,
            "a dead holder never lets go"
        );
        assert!(!free.region.held(), "let go after the probe");
    }

    /// A lock a live thread holds and lets go of (as shm's holds) is taken within a probe.
    #[test]
    fn a_lock_in_use_is_taken_within_a_probe() {
        let (_f, name) = TestFile::new("busy", 5);
        let region = Arc::new(Region::open(&name).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let users: Vec<_> = (0..2)
            .map(|_| {
                let (region, stop) = (region.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        lock(&region);
                        std::hint::black_box(0..200).for_each(|_| std::hint::spin_loop());
                        region.release();
                    }
                })
            })
            .collect();
        for _ in 0..20 {
            assert!(region.taken_within(Duration::from_millis(50)));
        }
        stop.store(true, Ordering::Relaxed);
        users.into_iter().for_each(|u| u.join().unwrap());
    }
}
