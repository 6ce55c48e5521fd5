//! The wire of our reliable-datagram handshake (`rdm`): frames on its TCP
//! connection, and the connection a QP keeps for the DAT connection's life.

use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;

/// "DRSR", version 4: this backend's RDM handshake (version 1 sent receipts
/// on the handshake's connection, 2 wrote them on the fabric; 3 carries
/// each side's connection id, the tag of the messages it receives, since
/// connections share endpoints: `port`; 4 carries our header's version 4,
/// where a peer on this host maps our key table: `cm::with_header`). A peer of
/// another version is rejected, not left waiting.
pub(crate) const MAGIC: [u8; 8] = [b'D', b'R', b'S', b'R', 0, 4, 0, 0];
/// What travels on the handshake's connection (one byte, then the fields).
pub(crate) const REQUEST: u8 = b'Q';
pub(crate) const ACCEPT: u8 = b'A';
pub(crate) const REJECT: u8 = b'R';
pub(crate) const READY: u8 = b'K';
pub(crate) const CLOSE: u8 = b'C';
/// The passive side's consumer accepted; its endpoint is being opened (as
/// an IB CM's MRA, it holds off the active side's timeout: opening an
/// ofi_rxm endpoint on verbs took 9 s in the soft-RoCE guest under load).
pub(crate) const ACCEPTING: u8 = b'W';
/// A datagram QP asks for the address of the one its peer accepts with
/// (`rdm::ud`), and the answer.
pub(crate) const UD_REQUEST: u8 = b'U';
pub(crate) const UD_ACCEPT: u8 = b'V';
/// The largest frame we read (addresses and private data are far smaller).
pub(crate) const MAX_FRAME: usize = 64 << 10;
/// One frame: its kind, then each field as a 32-bit length and its bytes.
pub(crate) fn frame(kind: u8, fields: &[&[u8]]) -> Vec<u8> {
    let mut v = vec![kind, fields.len() as u8];
    for f in fields {
        v.extend_from_slice(&(f.len() as u32).to_le_bytes());
        v.extend_from_slice(f);
    }
    v
}

/// Writes one frame. The handshake's sockets stay blocking (the thread
/// reading them asks `recv` not to wait): a frame is at most a few hundred
/// bytes on a connection whose peer reads it.
pub(crate) fn write_frame(mut s: &TcpStream, kind: u8, fields: &[&[u8]]) -> io::Result<()> {
    s.write_all(&frame(kind, fields))
}

/// A frame at the front of `buf`: its kind, its fields and its length in
/// bytes; None while incomplete. Err: longer than we read.
#[allow(clippy::type_complexity)]
pub(crate) fn parse_frame(buf: &[u8]) -> io::Result<Option<(u8, Vec<Vec<u8>>, usize)>> {
    let [kind, count, ..] = *buf else {
        return Ok(None);
    };
    let mut at = 2;
    let mut fields = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let Some(len) = buf.get(at..at + 4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        if at + 4 + len > MAX_FRAME {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "frame too long"));
        }
        let Some(f) = buf.get(at + 4..at + 4 + len) else {
            return Ok(None);
        };
        fields.push(f.to_vec());
        at += 4 + len;
    }
    Ok(Some((kind, fields, at)))
}

/// The handshake's connection of a QP: its socket, and which connection of
/// the QP it belongs to (a QP reset and connected again has a new one).
pub(crate) struct Link {
    /// Open for the DAT connection's life (its close or end is the disconnection).
    pub stream: Arc<TcpStream>,
    pub generation: u64,
}

impl Link {
    /// Ends the connection: with a close (a disconnection) or without (broken).
    pub(crate) fn end(&self, graceful: bool) {
        if graceful {
            let _ = write_frame(&self.stream, CLOSE, &[]);
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}
