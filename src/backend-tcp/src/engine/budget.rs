//! What peers make the target hold, counted per device (one per IA) against one budget.
//!
//! A peer can make us keep memory three ways: messages it sent that wait for a receive
//! (`Conn::held`), a frame whose header has come and whose payload we collect
//! (`Decoder::committed`: the whole payload counts from the header on, since we will hold all
//! of it), and answers to its reads it does not take from the socket (`Conn::answer_bytes`).
//! Each connection's sum is its `Charge` on the device's `PeerMemory`. A request frame whose
//! payload would take the total past the budget breaks, when its header comes and before
//! anything of it is kept, the connection that holds the most (`Engine::evict_for`): its own,
//! unless another holds more. The peers that hold memory lose their connections, the others
//! hold little (a large SEND into a posted receive, or a large WRITE, is placed as it
//! arrives: `Engine::take_over_send`, `take_over_write`) and keep theirs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{Conn, Engine};

/// The budget when DAPLRS_PEER_MEMORY does not set one.
pub(crate) const DEFAULT_PEER_MEMORY: usize = 64 << 20;

/// One device's budget and what its connections hold now.
pub(crate) struct PeerMemory {
    limit: usize,
    used: AtomicUsize,
}

impl Default for PeerMemory {
    fn default() -> PeerMemory {
        let limit = match std::env::var("DAPLRS_PEER_MEMORY") {
            Ok(v) => parse_size(&v).unwrap_or_else(|| {
                log::warn!("DAPLRS_PEER_MEMORY={v:?} is no size (like 64M); using the default");
                DEFAULT_PEER_MEMORY
            }),
            Err(_) => DEFAULT_PEER_MEMORY,
        };
        PeerMemory::new(limit)
    }
}

impl PeerMemory {
    pub(crate) fn new(limit: usize) -> PeerMemory {
        PeerMemory {
            limit,
            used: AtomicUsize::new(0),
        }
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// What every connection of the device holds, as last charged.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// A connection's share of its device's `PeerMemory`; dropped with the connection, it gives
/// its share back (however the connection ends).
pub(super) struct Charge {
    memory: Arc<PeerMemory>,
    amount: usize,
}

impl Charge {
    pub(super) fn new(memory: Arc<PeerMemory>) -> Charge {
        Charge { memory, amount: 0 }
    }

    fn set(&mut self, amount: usize) {
        if amount > self.amount {
            self.memory
                .used
                .fetch_add(amount - self.amount, Ordering::Relaxed);
        } else if amount < self.amount {
            self.memory
                .used
                .fetch_sub(self.amount - amount, Ordering::Relaxed);
        }
        self.amount = amount;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.set(0);
    }
}

impl Conn {
    /// What this connection's peer makes us hold now.
    fn holds(&mut self) -> usize {
        self.answers_pending();
        self.held_bytes + self.dec.committed() + self.answer_bytes
    }

    /// How many more bytes this connection's peer may make us keep.
    pub(super) fn room(&mut self) -> usize {
        let others = self.charge.memory.used().saturating_sub(self.charge.amount);
        self.charge
            .memory
            .limit
            .saturating_sub(others + self.holds())
    }

    /// Whether a large SEND may go straight into a receive (`Engine::take_over_send`): nothing
    /// held before it, no payload being placed already, frames on the socket (not a ring).
    pub(super) fn may_stream_send(&self) -> bool {
        self.held.is_empty() && self.sink.is_none() && self.same_host.reading_ring().is_none()
    }

    /// Brings this connection's charge up to date.
    pub(super) fn recharge(&mut self) {
        let holds = self.holds();
        if holds != self.charge.amount {
            self.charge.set(holds);
        }
    }
}

impl Engine {
    /// The budget has no room for a frame of `len` bytes of connection `token`: the
    /// established connection that holds the most goes instead, if it is another one and
    /// holds more than `token` would with the frame. A peer holding little (a legitimate one: its messages are received, its answers
    /// read) is not broken because one holding much filled the budget. The connection goes at
    /// once, with everything it held (BROKEN for its QP). Whether one went.
    pub(super) fn evict_for(&mut self, token: u64, len: usize) -> bool {
        let Some(mine) = self.conns.get_mut(&token).map(|c| c.holds() + len) else {
            return false;
        };
        let victim = self
            .conns
            .iter()
            .filter(|(t, c)| **t != token && matches!(c.phase, super::Phase::Established { .. }))
            .map(|(t, c)| (c.charge.amount, *t))
            .max();
        match victim {
            Some((amount, t)) if amount > mine => {
                log::warn!(
                    "connection {t}: holds {amount} bytes, the most of the device's peer memory budget ({} bytes), which connection {token} needs: broken",
                    self.peer_memory.limit()
                );
                self.conn_lost(t);
                true
            }
            _ => false,
        }
    }

    /// A charge on this device's budget for a new connection.
    pub(super) fn charge(&self) -> Charge {
        Charge::new(self.peer_memory.clone())
    }

    /// What peers may make this device hold, and hold now (tests).
    #[cfg(test)]
    pub(crate) fn peer_memory(&self) -> &PeerMemory {
        &self.peer_memory
    }

    /// Sets the device's budget (tests; before any connection).
    #[cfg(test)]
    pub(crate) fn set_peer_memory(&mut self, limit: usize) {
        self.peer_memory = Arc::new(PeerMemory::new(limit));
    }

    /// Connections whose peer ended while messages were held (tests).
    #[cfg(test)]
    pub(crate) fn ended_with_messages_held(&self) -> usize {
        self.conns.values().filter(|c| c.peer_end.is_some()).count()
    }
}

/// "64M", "512K", "1G" or a plain number of bytes.
pub(crate) fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (digits, shift) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 10),
        b'm' | b'M' => (&s[..s.len() - 1], 20),
        b'g' | b'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    digits.trim().parse::<usize>().ok()?.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("512k"), Some(512 << 10));
        assert_eq!(parse_size(" 1G "), Some(1 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn a_dropped_charge_gives_its_share_back() {
        let memory = Arc::new(PeerMemory::new(100));
        let mut a = Charge::new(memory.clone());
        let mut b = Charge::new(memory.clone());
        a.set(30);
        b.set(50);
        a.set(10);
        assert_eq!(memory.used(), 60);
        drop(b);
        assert_eq!(memory.used(), 10);
        drop(a);
        assert_eq!(memory.used(), 0);
    }
}
