//! The same-host byte channel: one direction of a connection's frame stream through shared
//! memory instead of the TCP socket.
//!
//! Each side makes a ring for what it receives (a memfd, size sealed) and names it in its
//! SAME_HOST offer; the peer maps it and, from its SWITCH frame on, writes every frame it
//! would have written to the socket into the ring instead. Frames, their order and every
//! rule of the engine are unchanged: only the bytes travel another way, with one copy in and
//! one out, in user space. The socket stays open: it carries the end of stream that says the
//! peer closed or died, read only after the ring is empty, so nothing written before is lost,
//! and doorbells (bytes without meaning that wake a reader asleep in poll) when the writer
//! could not get the ring's bell.
//!
//! The bell: the reader makes an eventfd with its ring and names it in the ring's header; the
//! writer takes a duplicate (pidfd_getfd) and signals it instead of sending a doorbell byte
//! through loopback TCP (a blocking ping-pong here: 3.4 us one-way through eventfds, 10 us
//! through TCP sockets). Where the kernel has no pidfd_getfd (before 5.6) or refuses it (a
//! seccomp filter), the writer keeps the socket's doorbells; the reader watches both, so
//! either side may do without.
//!
//! A single producer and a single consumer: the writer's side writes under its turn
//! (`writer_turn`: the engine's flushes and a QP lane's PLACED frames, engine/lane.rs), the
//! reader's under its engine lock. Positions count bytes ever written/read (wrapping u64); each side keeps its own
//! position privately and only publishes it, and every value read from the peer is checked
//! (a peer may write anything into the shared pages: it can break its own connection, not
//! make us read or write outside the mapping).
//!
//! Wake-ups without lost ones: a reader about to sleep counts itself in `sleepers`, then looks
//! at the tail once more; a writer publishes its tail, then looks at `sleepers` and rings the
//! doorbell if anyone may sleep. With sequentially consistent operations on both sides either
//! the writer sees the sleeper or the sleeper sees the data.
//!
//! A reader's progress thread that sleeps while an application thread of the reader polls the
//! ring (dat_evd_dequeue in a loop) counts itself apart, in `deferring`: it needs the bell
//! only once that poller has stopped. The poller stamps `polled_at` at each look, and the
//! writer rings for deferring sleepers only if the stamp is older than the lease the reader
//! grants its poller (`reader_needs_bell`). Before, the progress thread stayed off such a
//! ring and woke when the lease ended, to look whether it had been renewed: with a 100 us
//! lease, 10,000 wake-ups a second per polling process, each taking a CPU from a spinner
//! (same host, both sides polling: 8 B send p99 29-37 us against 4.5-5.5 without them). A
//! poller that stops within a lease of a frame leaves that frame to the progress thread's
//! next wake-up, which it bounds (`progress.rs`, `DEFER_BACKSTOP`).
//!
//! A writer that finds the ring full sets `writer_waiting` and looks at the head again; the
//! reader that frees room clears it and rings the writer's doorbell (on the other direction).
//!
//! The receive window: the reader also publishes here its posted receives (the next
//! RECV_SLOTS of its QP, each with its scatter list), so that the writer places a send's data
//! into the receive buffer itself, at once, and then writes a PLACED frame into the ring
//! instead of the data: the data needs no CPU of the receiver's, and the completion is the
//! receiver's to find when it next looks, in order with everything else (engine/samehost.rs).
//! Receive j of the connection (the j-th posted, which the j-th send or write-with-immediate
//! consumes) sits in slot j % RECV_SLOTS with a state word naming j: published by the reader,
//! taken by the writer (under the reader's key table mutex, across its check and its copy),
//! or withdrawn by the reader before it flushes its receives (under the same mutex, so that no
//! copy into a flushed receive's buffer can follow).

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use daplrs_backend::clock::monotonic_ns;

use super::board::{PeerSlot, Slot};
use super::peer::PeerProcess;
use super::{sys, Refusal};

const MAGIC: u64 = u64::from_le_bytes(*b"DAPLRSRG");
const VERSION: u32 = 5;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_CAPACITY: usize = 12;
/// The reader's eventfd (its descriptor plus one; 0: none), written before the ring is offered.
const OFF_BELL: usize = 16;
/// The reader's ready board (board.rs): its descriptor plus one (0: none, the reader then
/// reads the ring at every look), and the ring's slot on it.
const OFF_BOARD_FD: usize = 20;
const OFF_BOARD_SLOT: usize = 24;
/// The board's nonce (board.rs), which names it among the boards of the reader's process.
const OFF_BOARD_NONCE: usize = 32;
/// The reader's position (written by the reader only).
const OFF_HEAD: usize = 64;
/// The writer's position (written by the writer only).
const OFF_TAIL: usize = 128;
/// Threads of the reader that may be asleep in poll on the socket.
const OFF_SLEEPERS: usize = 192;
/// Threads of the reader asleep that need the bell only once its poller has stopped.
const OFF_DEFERRING: usize = 196;
/// When an application thread of the reader last polled the ring: CLOCK_MONOTONIC in ns (0:
/// never). In the sleepers' line, which the writer reads after each write anyway.
const OFF_POLLED_AT: usize = 200;
/// The writer found the ring full and waits for a doorbell.
const OFF_WRITER_WAITING: usize = 256;
/// The receive window: how many receives the reader has published (receives 0 to n - 1 of
/// the connection), then RECV_SLOTS slots of RECV_SLOT_LEN bytes: the state word (`state`),
/// the number of segments (u32; NOT_PLACEABLE: more than RECV_SGES), the segments (address
/// u64, length u32, key u32), and what the writer placed (`Placement`, written before it
/// takes the slot).
const OFF_RECV_PUBLISHED: usize = 4096;
const OFF_RECV_SLOTS: usize = 4096 + 64;
pub(crate) const RECV_SLOTS: usize = 64;
const RECV_SLOT_LEN: usize = 128;
/// Segments a published receive may have; one with more is published as NOT_PLACEABLE (the
/// writer then sends the data through the ring, as before).
pub(crate) const RECV_SGES: usize = 6;
const NOT_PLACEABLE: u32 = u32::MAX;
const RS_SGES: usize = 16;
const RECV_PUBLISHED: u64 = 1;
const RECV_TAKEN: u64 = 2;
const RECV_WITHDRAWN: u64 = 3;
const RS_PLACED: usize = RS_SGES + RECV_SGES * 16;
const _: () = assert!(RS_PLACED + 12 <= RECV_SLOT_LEN);
const OFF_DATA: usize = 16384;
const _: () = assert!(OFF_RECV_SLOTS + RECV_SLOTS * RECV_SLOT_LEN <= OFF_DATA);
/// Bytes of data per direction (resident once used: 4 MiB per busy connection). A 1 MiB
/// message and its header fit whole, so the writer fills while the reader drains instead
/// of both taking turns each message (1 MiB sends, 8 in flight, blocking, here: 4.2-4.6 GB/s
/// with 512 KiB, 2.8-3.7 with 1 MiB, 6.8-9.0 with 2 MiB). Larger frames pass in pieces.
pub(crate) const CAPACITY: usize = 2 << 20;

/// One direction's ring, as its reader (who made it) or its writer (who mapped the peer's).
pub(crate) struct Ring {
    map: sys::SharedMap,
    capacity: u64,
    /// Our own position: the head for the reader, the tail for the writer.
    pos: AtomicU64,
    /// The reader's memfd, until the writer said it has mapped it (its SWITCH).
    fd: parking_lot::Mutex<Option<OwnedFd>>,
    /// The reader's eventfd: for the reader, its own, to sleep on; for the writer, its
    /// duplicate, to signal. None: doorbells go through the socket.
    bell: Option<OwnedFd>,
    /// The ring's slot on the reader's board (board.rs): for the reader, to give back; for
    /// the writer, to mark after each write. None: the reader has no board for it.
    board: OnBoard,
    /// The writer's turn: held across every write, by the engine or a QP's lane.
    writer: parking_lot::Mutex<WriterTurn>,
}

/// What the writers of a ring must know of each other, under its writer's turn.
#[derive(Default)]
pub(crate) struct WriterTurn {
    /// The engine's last write left part of its output queue unwritten, perhaps part of a
    /// frame: nobody else writes before the engine has written the rest.
    pub engine_behind: bool,
}

enum OnBoard {
    None,
    /// Held for its drop, which gives the slot back.
    Reader(#[allow(dead_code)] Slot),
    Writer(PeerSlot),
}

impl Ring {
    /// A new ring for what we receive, to be named in our offer, with its slot on our board
    /// (None: every look reads it).
    pub fn create(slot: Option<Slot>) -> io::Result<Ring> {
        let len = OFF_DATA + CAPACITY;
        let fd = daplrs_backend::memfile::create_sealed("daplrs-ring", len)?;
        let map = sys::SharedMap::map(fd.as_raw_fd(), len)?;
        // Without a bell the writer sends doorbells through the socket, as before bells.
        let bell = sys::eventfd().ok();
        map.write_u32(OFF_VERSION, VERSION);
        map.write_u32(OFF_CAPACITY, CAPACITY as u32);
        let bell_fd = bell.as_ref().map_or(0, |b| b.as_raw_fd() as u32 + 1);
        map.write_u32(OFF_BELL, bell_fd);
        if let Some(s) = &slot {
            map.write_u32(OFF_BOARD_FD, s.board_fd() as u32 + 1);
            map.write_u32(OFF_BOARD_SLOT, s.index());
            map.write_u64(OFF_BOARD_NONCE, s.board_nonce());
        }
        map.write_u64(OFF_MAGIC, MAGIC);
        Ok(Ring {
            map,
            capacity: CAPACITY as u64,
            pos: AtomicU64::new(0),
            fd: parking_lot::Mutex::new(Some(fd)),
            bell,
            board: slot.map_or(OnBoard::None, OnBoard::Reader),
            writer: Default::default(),
        })
    }

    /// The descriptor our offer names (None once the writer has mapped it).
    pub fn fd(&self) -> Option<RawFd> {
        self.fd.lock().as_ref().map(|f| f.as_raw_fd())
    }

    /// The writer has mapped the ring: the descriptor is no longer needed (the mapping keeps
    /// the memory).
    pub fn close_fd(&self) {
        self.fd.lock().take();
    }

    /// Maps the ring a peer's offer names (descriptor `fd` of process `pid`), as its writer.
    pub fn open(peer: &PeerProcess, fd: u32) -> Result<Ring, Refusal> {
        let pid = peer.pid();
        let (file, len) = peer.memfd(fd)?;
        let want = (OFF_DATA + CAPACITY) as u64;
        if len != want {
            return Err(format!("pid {pid} fd {fd}: {len} bytes is no ring"));
        }
        let map = sys::SharedMap::map(file.as_raw_fd(), len as usize)
            .map_err(|e| format!("mmap pid {pid} fd {fd}: {e}"))?;
        if map.read_u64(OFF_MAGIC) != MAGIC
            || map.read_u32(OFF_VERSION) != VERSION
            || map.read_u32(OFF_CAPACITY) as usize != CAPACITY
        {
            return Err(format!(
                "pid {pid} fd {fd}: not a ring of version {VERSION}"
            ));
        }
        let bell = match map.read_u32(OFF_BELL).checked_sub(1) {
            None => None,
            Some(bell_fd) => match peer.eventfd(bell_fd) {
                Ok(dup) => Some(dup),
                Err(e) => {
                    log::info!(target: super::LOG, "pid {pid}: no bell for its ring ({e}): doorbells go through the socket");
                    None
                }
            },
        };
        // A reader that named a board reads the ring only when it is marked there: a board
        // we cannot mark is a ring we cannot write to.
        let board = match map.read_u32(OFF_BOARD_FD).checked_sub(1) {
            None => OnBoard::None,
            Some(board_fd) => {
                let (slot, nonce) = (map.read_u32(OFF_BOARD_SLOT), map.read_u64(OFF_BOARD_NONCE));
                OnBoard::Writer(PeerSlot::open(peer, board_fd, slot, nonce)?)
            }
        };
        let ring = Ring {
            capacity: CAPACITY as u64,
            pos: AtomicU64::new(0),
            fd: parking_lot::Mutex::new(None),
            bell,
            map,
            board,
            writer: Default::default(),
        };
        // The reader's ring is new: it has read nothing, and we start writing at its head.
        let head = ring.head().load(Ordering::SeqCst);
        if head != 0 || ring.tail().load(Ordering::SeqCst) != 0 {
            return Err(format!("pid {pid} fd {fd}: ring already in use"));
        }
        Ok(ring)
    }

    fn head(&self) -> &AtomicU64 {
        self.map.atomic_u64(OFF_HEAD)
    }
    fn tail(&self) -> &AtomicU64 {
        self.map.atomic_u64(OFF_TAIL)
    }
    fn sleepers(&self) -> &AtomicU32 {
        self.map.atomic_u32(OFF_SLEEPERS)
    }
    fn writer_waiting(&self) -> &AtomicU32 {
        self.map.atomic_u32(OFF_WRITER_WAITING)
    }
    fn deferring(&self) -> &AtomicU32 {
        self.map.atomic_u32(OFF_DEFERRING)
    }
    fn polled_at(&self) -> &AtomicU64 {
        self.map.atomic_u64(OFF_POLLED_AT)
    }

    /// Whether the reader's poller looked within `lease` of now. What a peer wrote there
    /// only decides whether it gets woken: a stamp from the future counts as a look now.
    pub fn polled_within(&self, lease: Duration) -> bool {
        let at = self.polled_at().load(Ordering::SeqCst);
        at != 0 && monotonic_ns().saturating_sub(at) < lease.as_nanos() as u64
    }

    // ---- the reader's side ----

    /// Whether the writer marks this ring on our board when it writes (else every look
    /// reads it).
    pub fn on_board(&self) -> bool {
        matches!(self.board, OnBoard::Reader(_))
    }

    /// The bell to poll (with the socket) while waiting for this ring's data.
    pub fn bell_fd(&self) -> Option<RawFd> {
        self.bell.as_ref().map(|b| b.as_raw_fd())
    }

    /// After the bell woke us: rearms it (before the ring is read, so that a later ring is
    /// not lost).
    pub fn drain_bell(&self) {
        if let Some(b) = &self.bell {
            sys::eventfd_drain(b.as_raw_fd());
        }
    }

    /// Bytes written and not read yet; an error if the writer's tail makes no sense.
    fn available(&self) -> io::Result<u64> {
        let head = self.pos.load(Ordering::Relaxed);
        let n = self.tail().load(Ordering::SeqCst).wrapping_sub(head);
        if n > self.capacity {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "same-host ring: the peer's position is out of range",
            ));
        }
        Ok(n)
    }

    /// Whether there is something to read (a broken ring counts: reading reports it).
    pub fn has_data(&self) -> bool {
        !matches!(self.available(), Ok(0))
    }

    /// Reads what the ring holds, up to `buf.len()`: WouldBlock when it is empty.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let avail = self.available()?;
        if avail == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = (avail as usize).min(buf.len());
        let head = self.pos.load(Ordering::Relaxed);
        let at = (head % self.capacity) as usize;
        let first = n.min(CAPACITY - at);
        self.map.copy_out(OFF_DATA + at, &mut buf[..first]);
        self.map.copy_out(OFF_DATA, &mut buf[first..n]);
        let head = head.wrapping_add(n as u64);
        self.pos.store(head, Ordering::Relaxed);
        self.head().store(head, Ordering::SeqCst);
        Ok(n)
    }

    /// After reading: whether the writer waits for room (and must be woken); clears the flag.
    pub fn take_writer_waiting(&self) -> bool {
        self.writer_waiting().load(Ordering::SeqCst) != 0
            && self.writer_waiting().swap(0, Ordering::SeqCst) != 0
    }

    /// A thread of ours is about to sleep in poll on the connection's socket: counts it, and
    /// returns whether data came meanwhile (then it must not sleep). Pair with `end_sleep`.
    pub fn begin_sleep(&self) -> bool {
        self.sleepers().fetch_add(1, Ordering::SeqCst);
        self.has_data()
    }

    pub fn end_sleep(&self) {
        self.sleepers().fetch_sub(1, Ordering::SeqCst);
    }

    /// An application thread polls the ring now (and will again soon): stamps the time.
    pub fn note_poller(&self) {
        self.polled_at().store(monotonic_ns(), Ordering::SeqCst);
    }

    /// Like `begin_sleep`, for a thread that leaves the ring to a polling application thread
    /// while that one looks: the writer wakes it only when the poller has not looked for a
    /// lease. Returns whether data came meanwhile. Pair with `end_defer`.
    pub fn begin_defer(&self) -> bool {
        self.deferring().fetch_add(1, Ordering::SeqCst);
        self.has_data()
    }

    pub fn end_defer(&self) {
        self.deferring().fetch_sub(1, Ordering::SeqCst);
    }

    // ---- the writer's side ----

    /// Writes as much of `slices` as there is room for: WouldBlock when the ring is full (the
    /// reader then rings our doorbell when it frees room).
    pub fn write(&self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        let tail = self.pos.load(Ordering::Relaxed);
        let mut room = self.room(tail)?;
        if room == 0 {
            self.writer_waiting().store(1, Ordering::SeqCst);
            room = self.room(tail)?;
            if room == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
        let mut written = 0usize;
        for s in slices {
            if written == room {
                break;
            }
            let take = s.len().min(room - written);
            let mut from = &s[..take];
            while !from.is_empty() {
                let at = (tail.wrapping_add(written as u64) % self.capacity) as usize;
                let n = from.len().min(CAPACITY - at);
                self.map.copy_in(OFF_DATA + at, &from[..n]);
                from = &from[n..];
                written += n;
            }
        }
        let tail = tail.wrapping_add(written as u64);
        self.pos.store(tail, Ordering::Relaxed);
        self.tail().store(tail, Ordering::SeqCst);
        if let OnBoard::Writer(slot) = &self.board {
            slot.mark();
        }
        Ok(written)
    }

    /// The writer's turn, held across each write (the ring has one producer).
    pub fn writer_turn(&self) -> parking_lot::MutexGuard<'_, WriterTurn> {
        self.writer.lock()
    }

    /// Whether `n` bytes fit now (the reader only ever makes more room).
    pub fn has_room_for(&self, n: usize) -> bool {
        self.room(self.pos.load(Ordering::Relaxed))
            .is_ok_and(|room| room >= n)
    }

    /// Whether the reader gave us its bell (else its doorbells go through the socket).
    pub fn has_bell(&self) -> bool {
        self.bell.is_some()
    }

    fn room(&self, tail: u64) -> io::Result<usize> {
        let used = tail.wrapping_sub(self.head().load(Ordering::SeqCst));
        if used > self.capacity {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "same-host ring: the peer's position is out of range",
            ));
        }
        Ok((self.capacity - used) as usize)
    }

    /// Whether a write would take something now.
    pub fn has_room(&self) -> bool {
        !matches!(self.room(self.pos.load(Ordering::Relaxed)), Ok(0))
    }

    /// After writing: whether a reader thread may be asleep and needs the doorbell: one that
    /// waits for this ring, or one that defers to the reader's poller while that poller has
    /// not looked within `lease` (the reader's lease, the same on both sides).
    pub fn reader_needs_bell(&self, lease: Duration) -> bool {
        self.sleepers().load(Ordering::SeqCst) != 0
            || (self.deferring().load(Ordering::SeqCst) != 0 && !self.polled_within(lease))
    }

    /// Wakes the reader through its bell: false if we have none (then the caller sends a
    /// doorbell through the socket).
    pub fn ring_bell(&self) -> bool {
        match &self.bell {
            Some(b) => {
                sys::eventfd_signal(b.as_raw_fd());
                true
            }
            None => false,
        }
    }
}

/// A state word of the receive window: receive `j` and what became of it.
fn state(j: u64, what: u64) -> u64 {
    (j << 2) | what
}

/// A receive the reader published, as the writer read it (untrusted: the writer checks every
/// segment against the reader's key table before it copies).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PublishedRecv {
    /// (address, length, key) of the first `len` segments, read into the writer's stack (a
    /// send placed here takes no malloc).
    read: [(u64, u32, u32); RECV_SGES],
    /// How many; None: more segments than a slot holds.
    len: Option<usize>,
}

/// What a writer placed in a receive it took: what the PLACED frame says too, kept in the
/// slot so that a reader that flushes its receives before it has read that frame still
/// completes the receive (the writer has completed its send).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    pub len: u32,
    /// The immediate data of a write-with-immediate.
    pub imm: Option<u32>,
    pub solicited: bool,
}

impl PublishedRecv {
    /// (address, length, key) of each segment; None: more segments than a slot holds.
    pub fn segments(&self) -> Option<&[(u64, u32, u32)]> {
        self.len.map(|n| &self.read[..n])
    }

    /// Bytes the receive takes.
    pub fn capacity(&self) -> u64 {
        self.segments()
            .into_iter()
            .flatten()
            .map(|&(_, len, _)| u64::from(len))
            .sum()
    }
}

impl Ring {
    fn recv_slot(&self, j: u64) -> usize {
        OFF_RECV_SLOTS + (j % RECV_SLOTS as u64) as usize * RECV_SLOT_LEN
    }

    fn recv_state(&self, j: u64) -> &AtomicU64 {
        self.map.atomic_u64(self.recv_slot(j))
    }

    // ---- the receive window, the reader's side ----

    /// Publishes receive `j` of the connection, with the scatter list `sgl` as (address,
    /// length, key); the caller publishes them in order, and only once receive j - RECV_SLOTS
    /// is done (its slot is then free). Visible to the writer once `set_published` counts it.
    pub fn publish_recv(&self, j: u64, sgl: impl ExactSizeIterator<Item = (u64, u32, u32)>) {
        let slot = self.recv_slot(j);
        let n = sgl.len();
        if n > RECV_SGES {
            self.map.write_u32(slot + 8, NOT_PLACEABLE);
        } else {
            self.map.write_u32(slot + 8, n as u32);
            for (i, (addr, len, key)) in sgl.enumerate() {
                let at = slot + RS_SGES + 16 * i;
                self.map.write_u64(at, addr);
                self.map.write_u32(at + 8, len);
                self.map.write_u32(at + 12, key);
            }
        }
        self.recv_state(j)
            .store(state(j, RECV_PUBLISHED), Ordering::SeqCst);
    }

    /// Receives 0 to `n` - 1 are published.
    pub fn set_published(&self, n: u64) {
        self.map
            .atomic_u64(OFF_RECV_PUBLISHED)
            .store(n, Ordering::SeqCst);
    }

    /// Withdraws receive `j` if the writer has not taken it (the caller holds our key table's
    /// mutex: a writer copying into it has finished). Returns whether it was still published.
    pub fn withdraw_recv(&self, j: u64) -> bool {
        self.recv_state(j)
            .compare_exchange(
                state(j, RECV_PUBLISHED),
                state(j, RECV_WITHDRAWN),
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
    }

    /// Whether the writer took receive `j` (and placed a message in it).
    pub fn recv_taken(&self, j: u64) -> bool {
        self.recv_state(j).load(Ordering::SeqCst) == state(j, RECV_TAKEN)
    }

    /// What the writer placed in receive `j`, if it took it.
    pub fn placement(&self, j: u64) -> Option<Placement> {
        if !self.recv_taken(j) {
            return None;
        }
        let at = self.recv_slot(j) + RS_PLACED;
        let flags = self.map.read_u32(at + 8);
        Some(Placement {
            len: self.map.read_u32(at),
            imm: (flags & 2 != 0).then(|| self.map.read_u32(at + 4)),
            solicited: flags & 1 != 0,
        })
    }

    // ---- the receive window, the writer's side ----

    /// Receive `k` of the connection, if the reader has published it and it is still there.
    pub fn published_recv(&self, k: u64) -> Option<PublishedRecv> {
        let published = self
            .map
            .atomic_u64(OFF_RECV_PUBLISHED)
            .load(Ordering::SeqCst);
        if k >= published || self.recv_state(k).load(Ordering::SeqCst) != state(k, RECV_PUBLISHED) {
            return None;
        }
        let slot = self.recv_slot(k);
        let n = self.map.read_u32(slot + 8) as usize;
        let mut recv = PublishedRecv {
            read: [(0, 0, 0); RECV_SGES],
            len: (n <= RECV_SGES).then_some(n),
        };
        for (i, seg) in recv.read.iter_mut().enumerate().take(recv.len.unwrap_or(0)) {
            let at = slot + RS_SGES + 16 * i;
            *seg = (
                self.map.read_u64(at),
                self.map.read_u32(at + 8),
                self.map.read_u32(at + 12),
            );
        }
        Some(recv)
    }

    /// Takes receive `k` with what was placed in it (the caller holds the reader's key table
    /// mutex and has just placed the message). False if it is no longer published (withdrawn:
    /// the reader flushed it).
    pub fn take_recv(&self, k: u64, placed: Placement) -> bool {
        let at = self.recv_slot(k) + RS_PLACED;
        self.map.write_u32(at, placed.len);
        self.map.write_u32(at + 4, placed.imm.unwrap_or(0));
        let flags = u32::from(placed.solicited) | if placed.imm.is_some() { 2 } else { 0 };
        self.map.write_u32(at + 8, flags);
        self.recv_state(k)
            .compare_exchange(
                state(k, RECV_PUBLISHED),
                state(k, RECV_TAKEN),
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
    }

    /// Whether receive `k` is still published (read under the reader's key table mutex,
    /// before copying into it).
    pub fn recv_published(&self, k: u64) -> bool {
        self.recv_state(k).load(Ordering::SeqCst) == state(k, RECV_PUBLISHED)
    }
}

#[cfg(test)]
impl Ring {
    /// A hostile writer's move: publishes a position of its choosing.
    pub(crate) fn publish_tail_for_test(&self, tail: u64) {
        self.tail().store(tail, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> PeerProcess {
        PeerProcess::new(std::process::id())
    }

    fn pair() -> (Ring, Ring) {
        let reader = Ring::create(None).unwrap();
        let writer = Ring::open(&me(), reader.fd().unwrap() as u32).unwrap();
        (reader, writer)
    }

    /// The receive window: what the reader publishes the writer reads back; a receive is
    /// taken once, only while published and only under its own number; withdrawn ones are
    /// gone for the writer, taken ones tell the reader what was placed.
    #[test]
    fn the_receive_window_hands_each_receive_over_once() {
        let (r, w) = pair();
        assert_eq!(w.published_recv(0), None, "nothing published yet");
        r.publish_recv(0, [(0x1000, 64, 0x4401), (0x2000, 16, 0x4402)].into_iter());
        let too_many: Vec<(u64, u32, u32)> = (0..RECV_SGES as u64 + 1).map(|i| (i, 1, 1)).collect();
        r.publish_recv(1, too_many.iter().copied());
        r.publish_recv(2, [(0x3000, 8, 0x4403)].into_iter());
        assert_eq!(w.published_recv(0), None, "not counted yet");
        r.set_published(3);
        let first = w.published_recv(0).expect("receive 0");
        assert_eq!(
            first.segments(),
            Some(&[(0x1000, 64, 0x4401), (0x2000, 16, 0x4402)][..])
        );
        assert_eq!(first.capacity(), 80);
        assert_eq!(
            w.published_recv(1).expect("receive 1").segments(),
            None,
            "not placeable"
        );
        let placed = Placement {
            len: 70,
            imm: None,
            solicited: true,
        };
        assert!(!w.take_recv(64, placed), "slot 0 holds receive 0, not 64");
        assert!(w.take_recv(0, placed));
        assert!(!w.take_recv(0, placed), "taken once");
        assert!(r.recv_taken(0));
        assert_eq!(r.placement(0), Some(placed));
        assert_eq!(w.published_recv(0), None, "taken: gone for the writer");
        assert!(r.withdraw_recv(2));
        assert!(!w.take_recv(2, placed), "withdrawn");
        assert_eq!(r.placement(2), None);
        assert!(!r.withdraw_recv(0), "a taken receive is not withdrawn");
        // Slot reuse: receive 64 in slot 0, once receive 0 is done.
        r.publish_recv(64, [(0x5000, 8, 0x4404)].into_iter());
        r.set_published(65);
        assert!(w.published_recv(64).is_some());
        assert!(!r.recv_taken(0), "the slot names receive 64 now");
    }

    #[test]
    fn bytes_pass_in_order_across_the_wrap() {
        let (r, w) = pair();
        let mut next_in = 0u8;
        let mut next_out = 0u8;
        let mut buf = vec![0u8; 100_000];
        // Writes of odd sizes, several times around the ring.
        for round in 0..40 {
            let chunk: Vec<u8> = (0..(70_001 + round))
                .map(|_| {
                    next_in = next_in.wrapping_add(1);
                    next_in
                })
                .collect();
            let mut left = &chunk[..];
            while !left.is_empty() {
                match w.write(&[IoSlice::new(left)]) {
                    Ok(n) => left = &left[n..],
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        assert!(r.take_writer_waiting() || r.has_data());
                        while let Ok(n) = r.read(&mut buf) {
                            for &b in &buf[..n] {
                                next_out = next_out.wrapping_add(1);
                                assert_eq!(b, next_out);
                            }
                        }
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        while let Ok(n) = r.read(&mut buf) {
            for &b in &buf[..n] {
                next_out = next_out.wrapping_add(1);
                assert_eq!(b, next_out);
            }
        }
        assert_eq!(next_in, next_out);
        assert_eq!(
            r.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
    }

    #[test]
    fn a_full_ring_refuses_and_flags_the_writer() {
        let (r, w) = pair();
        let big = vec![7u8; CAPACITY + 10];
        assert_eq!(w.write(&[IoSlice::new(&big)]).unwrap(), CAPACITY);
        let e = w.write(&[IoSlice::new(&big)]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let mut buf = vec![0u8; 10];
        assert_eq!(r.read(&mut buf).unwrap(), 10);
        assert!(r.take_writer_waiting());
        assert!(!r.take_writer_waiting());
        assert_eq!(w.write(&[IoSlice::new(&big)]).unwrap(), 10);
    }

    #[test]
    fn a_sleeper_either_sees_data_or_is_seen() {
        let (r, w) = pair();
        assert!(!r.begin_sleep());
        w.write(&[IoSlice::new(b"x")]).unwrap();
        assert!(w.reader_needs_bell(LEASE));
        r.end_sleep();
        assert!(!w.reader_needs_bell(LEASE));
        assert!(r.begin_sleep());
        r.end_sleep();
    }

    const LEASE: Duration = Duration::from_millis(100);

    #[test]
    fn a_deferring_sleeper_is_woken_only_once_the_poller_stopped() {
        let (r, w) = pair();
        assert!(!r.begin_defer());
        // Never polled: the deferring thread is the only reader and needs the bell.
        w.write(&[IoSlice::new(b"x")]).unwrap();
        assert!(w.reader_needs_bell(LEASE));
        // A poller looks: the writer leaves the frame to it.
        r.note_poller();
        assert!(!w.reader_needs_bell(LEASE));
        // ... until the poller has not looked for a lease.
        assert!(w.reader_needs_bell(Duration::ZERO));
        // A thread that waits for the ring is woken whatever the poller does.
        assert!(r.begin_sleep());
        assert!(w.reader_needs_bell(LEASE));
        r.end_sleep();
        r.end_defer();
        assert!(!w.reader_needs_bell(Duration::ZERO));
        // The deferring thread saw the data that came before it counted itself.
        assert!(r.begin_defer());
        r.end_defer();
    }

    #[test]
    fn a_peer_position_out_of_range_is_an_error_not_a_wild_copy() {
        let (r, w) = pair();
        // The writer's tail jumps past the ring's capacity: the reader refuses to read.
        w.tail().store(CAPACITY as u64 * 3, Ordering::SeqCst);
        let mut buf = [0u8; 8];
        assert_eq!(
            r.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        // A head past everything written: the writer refuses to write.
        let (r2, w2) = pair();
        r2.head().store(1000, Ordering::SeqCst);
        assert_eq!(
            w2.write(&[IoSlice::new(b"x")]).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    fn bell_rung(r: &Ring) -> bool {
        let mut p = libc::pollfd {
            fd: r.bell_fd().expect("the reader has a bell"),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd we own, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn the_writer_rings_the_readers_bell() {
        let (r, w) = pair();
        assert!(!bell_rung(&r));
        assert!(w.ring_bell());
        assert!(w.ring_bell());
        assert!(bell_rung(&r));
        r.drain_bell();
        assert!(!bell_rung(&r));
    }

    #[test]
    fn a_bell_that_is_no_eventfd_is_not_rung() {
        let r = Ring::create(None).unwrap();
        // The header names a descriptor that is no eventfd (here: the ring's own memfd, as a
        // hostile reader could): the writer maps the ring but takes no bell, and falls back
        // to the socket's doorbells instead of writing into whatever that descriptor is.
        let fd = r.fd().unwrap();
        r.map.write_u32(OFF_BELL, fd as u32 + 1);
        let w = Ring::open(&me(), fd as u32).unwrap();
        assert!(!w.ring_bell());
        // A descriptor that does not exist: the same.
        r.map.write_u32(OFF_BELL, i32::MAX as u32);
        let w = Ring::open(&me(), fd as u32).unwrap();
        assert!(!w.ring_bell());
    }

    #[test]
    fn only_a_fresh_ring_of_the_right_size_is_opened() {
        let (r, _w) = pair();
        // Already written to: refused.
        r.map.atomic_u64(OFF_TAIL).store(1, Ordering::SeqCst);
        assert!(Ring::open(&me(), r.fd().unwrap() as u32).is_err());
        // Not a ring (a key table's memfd, or any other file): refused.
        let other = daplrs_backend::memfile::create_sealed("not-a-ring", 8192).unwrap();
        assert!(Ring::open(&me(), other.as_raw_fd() as u32).is_err());
    }
}
