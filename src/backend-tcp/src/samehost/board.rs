//! The ready board: which of a device's same-host rings (ring.rs) hold data, marked by their
//! writers, so that a polling consumer's look reads those rings and no others (an MPI rank
//! has one connection per peer and polls them all in a loop: reading each ring's tail costs a
//! cache miss per connection, 1,024 of them a look).
//!
//! One board per device, in a memfd its peers map (once per peer process and board, however
//! many connections lead to it). Each ring the device reads gets a slot (a bit); the ring's
//! header names the board and the slot, so its writer finds both when it maps the ring. After
//! it publishes its tail, the writer sets the ring's bit and then the bit of that bit's word
//! in the summary; a look reads the summary (one cache line: nothing ready costs that read),
//! clears each word it finds marked, then each marked bit word, and reads the rings named.
//! Setting bottom-up and clearing top-down, with sequentially consistent operations on both
//! sides, loses no mark: a writer that finds its bits set already is sure that a look will
//! clear them after its tail was published, and so read what it wrote.
//!
//! A peer can mark any slot (a look then reads a ring with nothing in it) or clear marks (its
//! frames, or another connection's, then wait for the progress thread, which is rung as
//! before: ring.rs's sleepers): it slows us down, it cannot make us lose or misread a frame.
//! Only threads that look for a polling consumer take marks; the progress thread and waiting
//! threads keep watching each ring's bell, and a ring they read stays marked until the next
//! look, which then finds it empty.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::peer::PeerProcess;
use super::{sys, Refusal};

const MAGIC: u64 = u64::from_le_bytes(*b"DAPLRSBD");
const VERSION: u32 = 2;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_CAPACITY: usize = 12;
/// A random number naming this board among all boards of its process, over time: a ring
/// names its board by descriptor and nonce, so that its writer finds a board it maps already
/// without a look at the descriptor (which a board made later may have taken over).
const OFF_NONCE: usize = 16;
/// The summary: bit w says bit word w may have marks. One cache line.
const OFF_SUMMARY: usize = 64;
const SUMMARY_WORDS: usize = 8;
/// The bit words: bit s % 64 of word s / 64 says slot s's ring may hold data.
const OFF_BITS: usize = 128;
const BIT_WORDS: usize = SUMMARY_WORDS * 64;
/// Rings a board has slots for; a ring beyond them is read at every look, as before boards.
pub(crate) const SLOTS: usize = BIT_WORDS * 64;
const LEN: usize = 8192;
const _: () = assert!(OFF_BITS + BIT_WORDS * 8 <= LEN);

/// The board of a device, as its reader: made when its first ring is.
pub(crate) struct Board {
    map: sys::SharedMap,
    fd: OwnedFd,
    nonce: u64,
    /// The connection each slot's ring belongs to (0: free), and the free slots.
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    tokens: Vec<u64>,
    free: Vec<u32>,
}

/// A ring's slot on its reader's board, given back when dropped.
pub(crate) struct Slot {
    board: Arc<Board>,
    index: u32,
}

impl Slot {
    pub fn index(&self) -> u32 {
        self.index
    }
    pub fn board_fd(&self) -> RawFd {
        self.board.fd.as_raw_fd()
    }
    pub fn board_nonce(&self) -> u64 {
        self.board.nonce
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut slots = self.board.slots.lock();
        slots.tokens[self.index as usize] = 0;
        slots.free.push(self.index);
    }
}

impl Board {
    pub fn create() -> io::Result<Arc<Board>> {
        let fd = daplrs_backend::memfile::create_sealed("daplrs-board", LEN)?;
        let map = sys::SharedMap::map(fd.as_raw_fd(), LEN)?;
        map.write_u32(OFF_VERSION, VERSION);
        map.write_u32(OFF_CAPACITY, SLOTS as u32);
        let mut nonce = [0u8; 8];
        super::getrandom(&mut nonce);
        let nonce = u64::from_ne_bytes(nonce);
        map.write_u64(OFF_NONCE, nonce);
        map.write_u64(OFF_MAGIC, MAGIC);
        Ok(Arc::new(Board {
            map,
            fd,
            nonce,
            slots: Mutex::new(Slots::default()),
        }))
    }

    /// A slot for the ring of connection `token`; None when all are taken.
    pub fn slot(self: &Arc<Board>, token: u64) -> Option<Slot> {
        let mut slots = self.slots.lock();
        let index = match slots.free.pop() {
            Some(i) => i,
            None if slots.tokens.len() < SLOTS => {
                slots.tokens.push(0);
                (slots.tokens.len() - 1) as u32
            }
            None => return None,
        };
        slots.tokens[index as usize] = token;
        Some(Slot {
            board: self.clone(),
            index,
        })
    }

    fn summary(&self, w: usize) -> &AtomicU64 {
        self.map.atomic_u64(OFF_SUMMARY + 8 * w)
    }

    fn bits(&self, w: usize) -> &AtomicU64 {
        self.map.atomic_u64(OFF_BITS + 8 * w)
    }

    /// Whether any ring is marked: one cache line read.
    pub fn marked(&self) -> bool {
        (0..SUMMARY_WORDS).any(|w| self.summary(w).load(Ordering::SeqCst) != 0)
    }

    /// Clears the marks and appends the connections of the rings that were marked.
    pub fn take(&self, out: &mut Vec<u64>) {
        for s in 0..SUMMARY_WORDS {
            if self.summary(s).load(Ordering::SeqCst) == 0 {
                continue;
            }
            let mut words = self.summary(s).swap(0, Ordering::SeqCst);
            while words != 0 {
                let w = s * 64 + words.trailing_zeros() as usize;
                words &= words - 1;
                let mut bits = self.bits(w).swap(0, Ordering::SeqCst);
                let slots = self.slots.lock();
                while bits != 0 {
                    let slot = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    match slots.tokens.get(slot) {
                        Some(&token) if token != 0 => out.push(token),
                        _ => {} // a peer marked a free slot, or the ring just went
                    }
                }
            }
        }
    }
}

/// A reader's board as a writer maps it, shared by the rings it writes to that name it.
pub(crate) struct PeerBoard {
    map: sys::SharedMap,
}

/// The slot of a ring we write to on its reader's board.
pub(crate) struct PeerSlot {
    board: Arc<PeerBoard>,
    index: u32,
}

/// A peer's board: its process, its descriptor there and its nonce.
type PeerBoardId = (u32, u32, u64);

/// The boards of peers we map, while some ring uses them.
static PEER_BOARDS: Mutex<Vec<(PeerBoardId, Weak<PeerBoard>)>> = Mutex::new(Vec::new());

impl PeerSlot {
    /// Slot `index` of the board with `nonce` behind descriptor `fd` of `peer`: the board
    /// mapped already if it is, without a system call.
    pub fn open(peer: &PeerProcess, fd: u32, index: u32, nonce: u64) -> Result<PeerSlot, Refusal> {
        if index as usize >= SLOTS {
            return Err(format!(
                "pid {}: board slot {index} out of range",
                peer.pid()
            ));
        }
        let id = (peer.pid(), fd, nonce);
        let mut boards = PEER_BOARDS.lock();
        boards.retain(|(_, b)| b.strong_count() > 0);
        let found = boards
            .iter()
            .find(|(known, _)| *known == id)
            .and_then(|(_, b)| b.upgrade());
        let board = match found {
            Some(b) => b,
            None => {
                let b = Arc::new(PeerBoard::map(peer, fd, nonce)?);
                boards.push((id, Arc::downgrade(&b)));
                b
            }
        };
        Ok(PeerSlot { board, index })
    }

    /// After publishing the ring's tail: marks the ring, then its word (see the module doc).
    pub fn mark(&self) {
        let (w, bit) = (self.index as usize / 64, 1u64 << (self.index % 64));
        let bits = self.board.map.atomic_u64(OFF_BITS + 8 * w);
        if bits.load(Ordering::SeqCst) & bit == 0 {
            bits.fetch_or(bit, Ordering::SeqCst);
        }
        let (s, sbit) = (w / 64, 1u64 << (w % 64));
        let summary = self.board.map.atomic_u64(OFF_SUMMARY + 8 * s);
        if summary.load(Ordering::SeqCst) & sbit == 0 {
            summary.fetch_or(sbit, Ordering::SeqCst);
        }
    }
}

impl PeerBoard {
    fn map(peer: &PeerProcess, fd: u32, nonce: u64) -> Result<PeerBoard, Refusal> {
        let pid = peer.pid();
        let (file, len) = peer.memfd(fd)?;
        if len != LEN as u64 {
            return Err(format!("pid {pid} fd {fd}: {len} bytes is no board"));
        }
        let map = sys::SharedMap::map(file.as_raw_fd(), LEN)
            .map_err(|e| format!("mmap pid {pid} fd {fd}: {e}"))?;
        if map.read_u64(OFF_MAGIC) != MAGIC
            || map.read_u32(OFF_VERSION) != VERSION
            || map.read_u32(OFF_CAPACITY) as usize != SLOTS
        {
            return Err(format!(
                "pid {pid} fd {fd}: not a board of version {VERSION}"
            ));
        }
        if map.read_u64(OFF_NONCE) != nonce {
            return Err(format!("pid {pid} fd {fd}: not the board its ring names"));
        }
        Ok(PeerBoard { map })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked_tokens(board: &Board) -> Vec<u64> {
        let mut out = Vec::new();
        board.take(&mut out);
        out.sort_unstable();
        out
    }

    /// A writer's mark reaches one look, once; a board with nothing marked says so; a slot
    /// given back is no longer reported, and is reused.
    #[test]
    fn marks_reach_one_look() {
        let board = Board::create().expect("board");
        let pid = std::process::id();
        let fd = |s: &Slot| s.board_fd() as u32;
        let slots: Vec<Slot> = (1..=130).map(|t| board.slot(t).expect("slot")).collect();
        let me = PeerProcess::new(pid);
        let writer =
            |s: &Slot| PeerSlot::open(&me, fd(s), s.index(), s.board_nonce()).expect("peer slot");
        assert!(!board.marked());
        let (w1, w70, w130) = (writer(&slots[0]), writer(&slots[69]), writer(&slots[129]));
        for w in [&w1, &w70, &w130, &w70] {
            w.mark();
        }
        assert!(board.marked());
        assert_eq!(marked_tokens(&board), vec![1, 70, 130]);
        assert!(!board.marked());
        assert_eq!(marked_tokens(&board), Vec::<u64>::new());
        // Both writers map the board once.
        assert!(Arc::ptr_eq(&w1.board, &w130.board));
        let mut slots = slots;
        let gone = slots.remove(69);
        let index = gone.index();
        drop(gone);
        w70.mark();
        assert_eq!(marked_tokens(&board), Vec::<u64>::new());
        assert_eq!(board.slot(500).expect("slot").index(), index);
        let nonce = slots[0].board_nonce();
        assert!(PeerSlot::open(&me, fd(&slots[0]), SLOTS as u32, nonce).is_err());
        // A nonce that is not the board's is another board.
        assert!(PeerSlot::open(&me, fd(&slots[0]), 0, !nonce).is_err());
    }
}
