//! The TCP transport's wire protocol.
//!
//! Every message is a frame: a fixed 32-byte little-endian header followed by `payload_len`
//! bytes. The header is validated (known kind, payload length within the bound for that kind)
//! before any payload buffer is allocated, so a hostile length cannot make us allocate.
//!
//! ```text
//! offset size field
//!  0     1    kind         (Kind)
//!  1     1    status       (Status; 0 = OK)
//!  2     2    flags        (FLAG_SOLICITED)
//!  4     4    payload_len
//!  8     8    addr         (HELLO/ACCEPT: MAGIC; WRITE/READ_REQ: remote address)
//! 16     4    key          (HELLO/ACCEPT: VERSION; WRITE/READ_REQ: rkey)
//! 20     4    length       (READ_REQ: bytes to read)
//! 24     8    seq          (requests: sender's sequence number; ACK/READ_RESP: the request's)
//! ```
//!
//! Connection setup: the active side sends HELLO (payload: private data); the passive side
//! answers ACCEPT or REJECT (payload: private data). A HELLO or ACCEPT with a wrong magic or
//! version is refused and the connection closed. After ACCEPT both sides exchange:
//! SEND (payload: message) -> ACK; WRITE (payload: data) -> ACK; READ_REQ -> READ_RESP
//! (payload: data). A target processes requests strictly in order and answers each in order,
//! so the initiator matches answers to its oldest outstanding request (and checks `seq`).
//! A non-OK status in ACK/READ_RESP fails that request; the target then closes the connection
//! (remote access violations break the connection, as on an RDMA NIC). DISCONNECT is the
//! orderly goodbye; a connection closed without it is broken.

/// Header size in bytes.
pub const HEADER_LEN: usize = 32;
/// "DAPLRS" + 2 zero bytes, as little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"DAPLRS\0\0");
pub const VERSION: u32 = 1;
/// Largest private data of HELLO/ACCEPT/REJECT.
pub const MAX_PRIVATE_DATA: u32 = 1024;
pub const FLAG_SOLICITED: u16 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Accept = 2,
    Reject = 3,
    Send = 4,
    Write = 5,
    ReadReq = 6,
    ReadResp = 7,
    Ack = 8,
    Disconnect = 9,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Accept,
            3 => Kind::Reject,
            4 => Kind::Send,
            5 => Kind::Write,
            6 => Kind::ReadReq,
            7 => Kind::ReadResp,
            8 => Kind::Ack,
            9 => Kind::Disconnect,
            _ => return None,
        })
    }
}

/// Outcome of a request at the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    /// rkey not live, range outside the region, privilege missing, or PZ mismatch.
    RemoteAccess = 1,
    /// The receive buffer was too small for the message.
    RemoteLength = 2,
    /// The request was malformed (e.g. read length over the limit).
    RemoteInvalid = 3,
    /// HELLO/ACCEPT with an unsupported version.
    BadVersion = 4,
}

impl Status {
    fn from_u8(v: u8) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::RemoteAccess,
            2 => Status::RemoteLength,
            3 => Status::RemoteInvalid,
            4 => Status::BadVersion,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub status: Status,
    pub flags: u16,
    pub payload_len: u32,
    pub addr: u64,
    pub key: u32,
    pub length: u32,
    pub seq: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    UnknownKind(u8),
    UnknownStatus(u8),
    /// payload_len over the bound for its kind.
    TooLong { kind: Kind, len: u32 },
    BadMagic,
    BadVersion(u32),
}

/// Bounds a peer must respect; from the device limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest SEND and WRITE payload and READ_REQ length.
    pub max_message: u32,
}

impl Header {
    pub fn new(kind: Kind) -> Header {
        Header {
            kind,
            status: Status::Ok,
            flags: 0,
            payload_len: 0,
            addr: 0,
            key: 0,
            length: 0,
            seq: 0,
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind as u8;
        b[1] = self.status as u8;
        b[2..4].copy_from_slice(&self.flags.to_le_bytes());
        b[4..8].copy_from_slice(&self.payload_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..20].copy_from_slice(&self.key.to_le_bytes());
        b[20..24].copy_from_slice(&self.length.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Parses and bounds-checks a header received from a peer.
    pub fn decode(b: &[u8; HEADER_LEN], limits: &Limits) -> Result<Header, WireError> {
        let kind = Kind::from_u8(b[0]).ok_or(WireError::UnknownKind(b[0]))?;
        let status = Status::from_u8(b[1]).ok_or(WireError::UnknownStatus(b[1]))?;
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let h = Header {
            kind,
            status,
            flags: u16::from_le_bytes([b[2], b[3]]),
            payload_len: u32_at(4),
            addr: u64_at(8),
            key: u32_at(16),
            length: u32_at(20),
            seq: u64_at(24),
        };
        let bound = match kind {
            Kind::Hello | Kind::Accept | Kind::Reject => MAX_PRIVATE_DATA,
            Kind::Send | Kind::Write | Kind::ReadResp => limits.max_message,
            Kind::ReadReq | Kind::Ack | Kind::Disconnect => 0,
        };
        if h.payload_len > bound {
            return Err(WireError::TooLong { kind, len: h.payload_len });
        }
        if kind == Kind::ReadReq && h.length > limits.max_message {
            return Err(WireError::TooLong { kind, len: h.length });
        }
        if matches!(kind, Kind::Hello | Kind::Accept) {
            if h.addr != MAGIC {
                return Err(WireError::BadMagic);
            }
            if h.key != VERSION {
                return Err(WireError::BadVersion(h.key));
            }
        }
        Ok(h)
    }
}

/// Appends a whole frame to an output buffer.
pub fn put_frame(out: &mut Vec<u8>, mut header: Header, payload: &[u8]) {
    header.payload_len = payload.len() as u32;
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
}

/// A handshake header (HELLO or ACCEPT) with magic and version.
pub fn handshake(kind: Kind) -> Header {
    let mut h = Header::new(kind);
    h.addr = MAGIC;
    h.key = VERSION;
    h
}

/// Incremental frame reader over a byte stream.
#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
    start: usize,
    /// Header of the frame whose payload is being collected.
    pending: Option<Header>,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Adds bytes read from the socket.
    pub fn feed(&mut self, data: &[u8]) {
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes buffered and not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete frame, None if more bytes are needed, or the error that makes the
    /// stream unusable.
    pub fn next_frame(&mut self, limits: &Limits) -> Result<Option<(Header, Vec<u8>)>, WireError> {
        if self.pending.is_none() {
            if self.buffered() < HEADER_LEN {
                return Ok(None);
            }
            let mut hb = [0u8; HEADER_LEN];
            hb.copy_from_slice(&self.buf[self.start..self.start + HEADER_LEN]);
            let h = Header::decode(&hb, limits)?;
            self.start += HEADER_LEN;
            self.pending = Some(h);
        }
        let Some(h) = self.pending else { return Ok(None) };
        let len = h.payload_len as usize;
        if self.buffered() < len {
            return Ok(None);
        }
        let payload = self.buf[self.start..self.start + len].to_vec();
        self.start += len;
        self.pending = None;
        Ok(Some((h, payload)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { max_message: 1 << 20 };

    #[test]
    fn header_round_trips() {
        let mut h = Header::new(Kind::Write);
        h.addr = 0x1122_3344_5566_7788;
        h.key = 0xdead_beef;
        h.length = 77;
        h.seq = 9;
        h.flags = FLAG_SOLICITED;
        h.payload_len = 5;
        let b = h.encode();
        assert_eq!(Header::decode(&b, &LIMITS), Ok(h));
    }

    #[test]
    fn decoder_reassembles_split_frames() {
        let mut out = Vec::new();
        put_frame(&mut out, Header::new(Kind::Send), b"hello");
        put_frame(&mut out, handshake(Kind::Accept), b"pd");
        let mut d = Decoder::new();
        let mut frames = Vec::new();
        for chunk in out.chunks(3) {
            d.feed(chunk);
            while let Some(f) = d.next_frame(&LIMITS).expect("valid stream") {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].0.kind, Kind::Send);
        assert_eq!(frames[0].1, b"hello");
        assert_eq!(frames[1].0.kind, Kind::Accept);
        assert_eq!(frames[1].1, b"pd");
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn hostile_lengths_are_refused_before_allocation() {
        let mut h = Header::new(Kind::Send);
        h.payload_len = u32::MAX;
        let mut d = Decoder::new();
        d.feed(&h.encode());
        assert!(matches!(d.next_frame(&LIMITS), Err(WireError::TooLong { .. })));

        let mut h = handshake(Kind::Hello);
        h.payload_len = MAX_PRIVATE_DATA + 1;
        assert!(Header::decode(&h.encode(), &LIMITS).is_err());

        let mut h = Header::new(Kind::Ack);
        h.payload_len = 1;
        assert!(Header::decode(&h.encode(), &LIMITS).is_err());

        let mut h = Header::new(Kind::ReadReq);
        h.length = (1 << 20) + 1;
        assert!(Header::decode(&h.encode(), &LIMITS).is_err());
    }

    #[test]
    fn garbage_and_wrong_versions_are_errors() {
        let mut b = [0xffu8; HEADER_LEN];
        assert_eq!(Header::decode(&b, &LIMITS), Err(WireError::UnknownKind(0xff)));
        b[0] = Kind::Ack as u8;
        assert_eq!(Header::decode(&b, &LIMITS), Err(WireError::UnknownStatus(0xff)));
        let mut h = handshake(Kind::Hello);
        h.key = VERSION + 1;
        assert_eq!(Header::decode(&h.encode(), &LIMITS), Err(WireError::BadVersion(VERSION + 1)));
        let mut h = handshake(Kind::Hello);
        h.addr = 0;
        assert_eq!(Header::decode(&h.encode(), &LIMITS), Err(WireError::BadMagic));
    }
}
