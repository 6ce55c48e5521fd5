//! A port's eager buffers (reliable datagrams): where every connection's
//! short messages land, so that the provider holds a few receives per port,
//! not the consumer's receives of every connection.
//!
//! A provider matches a tagged message against its posted receives in
//! posting order (libfabric 1.17's shm and ofi_rxm walk one list per
//! endpoint): with each of 1,024 connections' receives posted on the port,
//! a message for the connection that reposted last walked past all the
//! others' (6 ns each on shm: a round trip four times that of one
//! connection, issue 37). So the port posts `BUFFERS` receives of its own
//! that take any message tagged `EAGER` (the rest of the tag, the receiving
//! connection's number, is ignored in the match and read from the
//! completion), and the connection copies what landed into its oldest
//! receive (`OfiQp::arrived`). A message longer than `EAGER_MAX` is sent
//! under its connection's `LARGE` tag, after an eager `ANNOUNCE` of it; the
//! announce gives the provider the connection's oldest receive under that
//! tag, and the provider places the message there (or keeps it until then,
//! as it keeps any message that finds no receive).

use daplrs_backend::{Result, WcStatus};
use ofi_sys as fi;

use crate::bounce::{post_buffer, register_for_recv};
use crate::cq::Done;
use crate::domain::Domain;
use crate::Fid;

/// Tag bits (the low 32 are the receiving connection's number): a message
/// for the eager buffers; with it, the announce of a large message; a large
/// message's own.
pub(crate) const EAGER: u64 = 1 << 63;
pub(crate) const ANNOUNCE: u64 = 1 << 62;
pub(crate) const LARGE: u64 = 1 << 61;
/// The longest message sent eagerly (shm's inject size: what it copies
/// through its own queue anyway).
pub(crate) const EAGER_MAX: usize = 4096;
/// Eager buffers a port keeps posted. Messages beyond wait in the provider
/// (as messages with no receive do) until a buffer is posted again.
pub(crate) const BUFFERS: usize = 64;

/// What landed for a connection, in the order it landed.
pub(crate) enum Arrival {
    /// A short message: its bytes and remote CQ data.
    Eager { bytes: Vec<u8>, data: Option<u64> },
    /// A large message follows under the connection's `LARGE` tag.
    Large,
}

/// What an eager buffer took for a connection, or how it failed.
pub(crate) type Landing = std::result::Result<Arrival, WcStatus>;

struct Buffer {
    /// Closed before `mem` is freed (fields drop in order).
    mr: Option<Fid<fi::fid_mr>>,
    mem: Box<[u8]>,
    posted: bool,
}

/// A port's eager buffers: owned with its endpoint (and parked with it: see
/// `port::Keeper`), so that none is freed while the provider may write one.
pub(crate) struct EagerPool {
    bufs: Vec<Buffer>,
}

impl EagerPool {
    /// `BUFFERS` buffers, registered where the provider needs descriptors.
    pub(crate) fn new(dev: &Domain) -> Result<EagerPool> {
        let mut bufs = Vec::with_capacity(BUFFERS);
        for _ in 0..BUFFERS {
            let mut mem = vec![0u8; EAGER_MAX].into_boxed_slice();
            let mr = register_for_recv(dev, &mut mem, "fi_mr_regattr (eager buffer)")?;
            bufs.push(Buffer {
                mr,
                mem,
                posted: false,
            });
        }
        Ok(EagerPool { bufs })
    }

    /// Posts every buffer not posted on `ep`; `context` gives a slot's
    /// request context. Returns whether all are posted (a busy provider
    /// leaves some for the progress thread: `Port::repost`).
    pub(crate) fn post_all(
        &mut self,
        ep: *mut fi::fid_ep,
        context: impl Fn(usize) -> *mut libc::c_void,
    ) -> bool {
        for slot in 0..self.bufs.len() {
            if !self.bufs[slot].posted && !self.post(ep, slot, context(slot)) {
                return false;
            }
        }
        true
    }

    /// Posts buffer `slot`; false: the provider refused it for now.
    pub(crate) fn post(
        &mut self,
        ep: *mut fi::fid_ep,
        slot: usize,
        context: *mut libc::c_void,
    ) -> bool {
        let Some(buf) = self.bufs.get_mut(slot) else {
            return true;
        };
        // Any message with EAGER set, whatever its connection.
        let tag = Some((EAGER, !EAGER));
        let rc = post_buffer(ep, &mut buf.mem, buf.mr.as_ref(), tag, context);
        // Busy (EAGAIN), or shm's receive entries all hold messages that came
        // before a receive (ENOMEM): the progress thread posts it again.
        if rc == 0 {
            buf.posted = true;
        } else if rc != -(fi::FI_EAGAIN as isize) && rc != -(fi::FI_ENOMEM as isize) {
            log::warn!("eager buffer not posted: {}", fi::strerror(rc as i32));
        }
        rc == 0
    }

    /// Buffer `slot` completed (`done`): what landed, for the connection its
    /// tag names (`conn_of`), copied out; the buffer is to be posted again.
    /// None: nothing of a connection (a buffer cancelled as the port closes).
    pub(crate) fn landed(&mut self, slot: usize, done: &Done) -> Option<Landing> {
        let buf = self.bufs.get_mut(slot)?;
        buf.posted = false;
        let arrival = match done.result {
            // Cancelled as the endpoint closes: not posted again.
            Err(WcStatus::Flushed) => return None,
            Err(status) => Err(status),
            Ok(_) if done.tag & ANNOUNCE != 0 => Ok(Arrival::Large),
            Ok(len) => {
                let bytes = buf.mem.get(..len as usize).unwrap_or(&buf.mem).to_vec();
                Ok(Arrival::Eager {
                    bytes,
                    data: done.data,
                })
            }
        };
        (done.tag & EAGER != 0).then_some(arrival)
    }
}

/// The connection a message's tag names (its low 32 bits).
pub(crate) fn conn_of(tag: u64) -> u32 {
    tag as u32
}
