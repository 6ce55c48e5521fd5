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
//! 16     4    key          (HELLO/ACCEPT: VERSION; WRITE/READ_REQ: rkey; SEND with
//!                           FLAG_INVALIDATE: the target's rkey to invalidate)
//! 20     4    length       (READ_REQ: bytes to read; WRITE_IMM: the immediate data)
//! 24     8    seq          (requests: sender's sequence number; ACK/READ_RESP: the request's)
//! ```
//!
//! Connection setup: the active side sends HELLO (payload: private data); the passive side
//! answers ACCEPT or REJECT (payload: private data). A HELLO or ACCEPT with a wrong magic or
//! version is refused and the connection closed. After ACCEPT both sides exchange:
//! SEND (payload: message) -> ACK; WRITE (payload: data) -> ACK; READ_REQ -> READ_RESP
//! (payload: data); WRITE_IMM (payload: data) -> ACK, which also consumes a receive at the
//! target; ATOMIC (flags: FLAG_CMP_SWAP or FLAG_FETCH_ADD; payload: compare-or-add and swap,
//! two little-endian u64) -> READ_RESP (payload: the word's previous value, 8 bytes). A target processes requests strictly in order and answers each in order,
//! so the initiator matches answers to its oldest outstanding request (and checks `seq`).
//! A non-OK status in ACK/READ_RESP fails that request; the target then closes the connection
//! (remote access violations break the connection, as on an RDMA NIC). DISCONNECT is the
//! orderly goodbye; a connection closed without it is broken.
//!
//! Same-host path (samehost/): a HELLO with FLAG_SAME_HOST says the active side can map a
//! peer's registration table and offers its own; an ACCEPT with the flag says the same of the
//! passive side, which sends a SAME_HOST frame (payload: a `SameHostOffer`) right after it;
//! the active side answers with its own SAME_HOST frame once it has the ACCEPT. A SAME_HOST
//! frame is allowed only once, only on an established connection, only after the receiver
//! advertised the flag; its payload is exactly SAME_HOST_OFFER_LEN bytes.

/// Header size in bytes.
pub const HEADER_LEN: usize = 32;
/// "DAPLRS" + 2 zero bytes, as little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"DAPLRS\0\0");
pub const VERSION: u32 = 1;
/// Largest private data of HELLO/ACCEPT/REJECT.
pub const MAX_PRIVATE_DATA: u32 = 1024;
pub const FLAG_SOLICITED: u16 = 1;
/// ATOMIC: compare-and-swap (payload: compare, swap).
pub const FLAG_CMP_SWAP: u16 = 2;
/// ATOMIC: fetch-and-add (payload: add, 0).
pub const FLAG_FETCH_ADD: u16 = 4;
/// SEND: with invalidate; `key` is the target's rkey to invalidate once the message is placed.
pub const FLAG_INVALIDATE: u16 = 8;
/// Payload of an ATOMIC request; of its READ_RESP answer, 8 bytes.
pub const ATOMIC_PAYLOAD: u32 = 16;
/// HELLO/ACCEPT: unreliable-datagram address resolution instead of a connection; `length` is
/// the sender's datagram QP number (the UDP port of its datagram socket). The connection
/// closes after the ACCEPT (or REJECT).
pub const FLAG_UD: u16 = 16;
/// HELLO/ACCEPT: the sender can use a same-host peer's registration table and will send a
/// SAME_HOST offer of its own (see the module docs).
pub const FLAG_SAME_HOST: u16 = 32;
/// PLACED: it completes a write-with-immediate; `key` is the immediate data.
pub const FLAG_IMMEDIATE: u16 = 64;
/// SWITCH: declined. The sender could not use the receiver's offer (its table or its ring)
/// and goes on writing to the socket: the receiver stops reading for it in its ring.
pub const FLAG_DECLINED: u16 = 128;
/// Payload of a SAME_HOST frame: a `SameHostOffer`.
pub const SAME_HOST_OFFER_LEN: u32 = 32;

/// What a peer on the same host needs to use our registration table: our pid, the number
/// of the table's memfd in our process (for /proc/<pid>/fd/<fd>), the table's random nonce,
/// the address in our memory of a copy of that nonce (a process_vm_readv probe of it proves
/// cross-memory attach reaches this very process), and the protection domain of the QP at
/// our end of this connection (remote keys must belong to it).
///
/// ```text
/// offset size field
///  0     4    pid
///  4     4    fd
///  8     8    nonce
/// 16     8    nonce_addr
/// 24     4    pd
/// 28     4    zero
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SameHostOffer {
    pub pid: u32,
    pub fd: u32,
    pub nonce: u64,
    pub nonce_addr: u64,
    pub pd: u32,
    /// Our ring for what the peer sends (its descriptor in process `pid`), if we made one.
    pub ring_fd: Option<u32>,
}

impl SameHostOffer {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(SAME_HOST_OFFER_LEN as usize);
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.fd.to_le_bytes());
        b.extend_from_slice(&self.nonce.to_le_bytes());
        b.extend_from_slice(&self.nonce_addr.to_le_bytes());
        b.extend_from_slice(&self.pd.to_le_bytes());
        // 0: no ring; else the descriptor plus one.
        let ring = self.ring_fd.map_or(0, |fd| fd.saturating_add(1));
        b.extend_from_slice(&ring.to_le_bytes());
        b
    }

    /// Parses a peer's offer: None unless exactly SAME_HOST_OFFER_LEN bytes.
    pub fn decode(p: &[u8]) -> Option<SameHostOffer> {
        if p.len() != SAME_HOST_OFFER_LEN as usize {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&p[o..o + 8]);
            u64::from_le_bytes(a)
        };
        Some(SameHostOffer {
            pid: u32_at(0),
            fd: u32_at(4),
            nonce: u64_at(8),
            nonce_addr: u64_at(16),
            pd: u32_at(24),
            ring_fd: u32_at(28).checked_sub(1),
        })
    }
}

/// A datagram (the UDP payload of one DAT datagram): an 8-byte header, then the message.
///
/// ```text
/// offset size field
///  0     4    magic    "DAUD"
///  4     1    version  (UD_VERSION)
///  5     1    flags    (FLAG_SOLICITED)
///  6     2    zero
/// ```
pub const UD_HEADER_LEN: usize = 8;
pub const UD_MAGIC: [u8; 4] = *b"DAUD";
pub const UD_VERSION: u8 = 1;
/// The largest UDP payload of an IPv4 datagram (65535 less the IPv4 and UDP headers).
pub const UDP_MAX_PAYLOAD: u32 = 65535 - 20 - 8;

/// The header of a datagram carrying `flags`.
pub fn ud_header(flags: u16) -> [u8; UD_HEADER_LEN] {
    let mut h = [0u8; UD_HEADER_LEN];
    h[..4].copy_from_slice(&UD_MAGIC);
    h[4] = UD_VERSION;
    h[5] = flags as u8;
    h
}

/// The flags and message of a datagram received from anyone; None for what is not one of
/// ours (wrong magic or version, too short), which is dropped.
pub fn ud_parse(d: &[u8]) -> Option<(u16, &[u8])> {
    if d.len() < UD_HEADER_LEN || d[..4] != UD_MAGIC || d[4] != UD_VERSION {
        return None;
    }
    Some((u16::from(d[5]), &d[UD_HEADER_LEN..]))
}

/// The largest message one datagram carries on a link of MTU `link_mtu`: what an IPv4 packet
/// holds after its IPv4 and UDP headers and our datagram header, so that no datagram is
/// fragmented (and never more than a UDP datagram holds).
pub fn ud_max_message(link_mtu: u32) -> u32 {
    let overhead = 20 + 8 + UD_HEADER_LEN as u32;
    link_mtu
        .saturating_sub(overhead)
        .min(UDP_MAX_PAYLOAD - UD_HEADER_LEN as u32)
}

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
    WriteImm = 10,
    Atomic = 11,
    /// A same-host offer (payload: `SameHostOffer`).
    SameHost = 12,
    /// The last frame of this direction on the socket: the rest come through the receiver's
    /// same-host ring (samehost/ring.rs); no payload.
    Switch = 13,
    /// Wakes the receiver (whose ring has room again for our writes); no payload.
    Doorbell = 14,
    /// A send (or write-with-immediate) whose data the sender already placed in the
    /// receiver's posted receive `addr` (the receive window of samehost/ring.rs; for a
    /// write-with-immediate, in the memory its rkey named): `length` bytes, the immediate data
    /// in `key` with FLAG_IMMEDIATE, FLAG_SOLICITED as for SEND. No payload, no answer.
    Placed = 15,
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
            10 => Kind::WriteImm,
            11 => Kind::Atomic,
            12 => Kind::SameHost,
            13 => Kind::Switch,
            14 => Kind::Doorbell,
            15 => Kind::Placed,
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
    TooLong {
        kind: Kind,
        len: u32,
    },
    BadMagic,
    BadVersion(u32),
    /// A frame of a kind the connection's phase does not allow (e.g. a SEND before the
    /// handshake), refused on its header, before any of its payload is buffered.
    Unexpected(Kind),
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
            Kind::Send | Kind::Write | Kind::WriteImm | Kind::ReadResp => limits.max_message,
            Kind::Atomic => ATOMIC_PAYLOAD,
            Kind::SameHost => SAME_HOST_OFFER_LEN,
            Kind::ReadReq
            | Kind::Ack
            | Kind::Disconnect
            | Kind::Switch
            | Kind::Doorbell
            | Kind::Placed => 0,
        };
        if h.payload_len > bound {
            return Err(WireError::TooLong {
                kind,
                len: h.payload_len,
            });
        }
        if kind == Kind::ReadReq && h.length > limits.max_message {
            return Err(WireError::TooLong {
                kind,
                len: h.length,
            });
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

/// Appends a whole frame to an output buffer (tests and fuzzers: the engine encodes in place).
#[cfg(any(test, feature = "fuzzing"))]
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

/// Payloads at least this large are read from the socket straight into their frame buffer.
pub const DIRECT_READ_MIN: usize = 64 * 1024;

/// Incremental frame reader over a byte stream.
#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
    start: usize,
    /// Header of the frame whose payload is being collected.
    pending: Option<Header>,
    /// That frame's payload so far (capacity reserved once the header is validated).
    payload: Vec<u8>,
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

    /// Forgets the bytes buffered past the last frame returned: after a SWITCH frame, what
    /// followed it on the socket are doorbells (the frames come through the ring).
    pub fn discard_buffered(&mut self) {
        self.buf.clear();
        self.start = 0;
    }

    /// Whether nothing is buffered: no frame begun (a signal handler serves only then).
    pub fn is_idle(&self) -> bool {
        self.buf.len() == self.start && self.pending.is_none()
    }

    /// Bytes buffered and not yet returned as frames (tests and fuzzers).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start + self.payload.len()
    }

    /// Bytes buffered and to come for frames begun: what is buffered, and the whole payload of
    /// a frame whose header has come (it will all be kept).
    pub fn committed(&self) -> usize {
        self.buf.len() - self.start + self.pending.map_or(0, |h| h.payload_len as usize)
    }

    /// The header of the frame whose payload is being collected, if any.
    pub fn pending(&self) -> Option<Header> {
        self.pending
    }

    /// Stops collecting the pending frame's payload, when nothing is buffered past it: the
    /// caller reads the rest from the stream itself. Returns the header and the payload bytes
    /// received so far; the next bytes of the stream are the rest of that payload.
    pub fn take_pending(&mut self) -> Option<(Header, Vec<u8>)> {
        if self.start != self.buf.len() {
            return None;
        }
        let h = self.pending.take()?;
        Some((h, std::mem::take(&mut self.payload)))
    }

    /// Reads the rest of a large pending payload straight from `r` into the frame's buffer
    /// (no intermediate copy, no zero-filling), once every byte buffered before it has been
    /// consumed. None when that does not apply; else what the read gave: Ok(0) is end of
    /// stream.
    pub fn read_direct<R: std::io::Read>(&mut self, r: &mut R) -> Option<std::io::Result<usize>> {
        let want = self.payload.capacity() - self.payload.len();
        if self.pending.is_none() || self.start != self.buf.len() || want < DIRECT_READ_MIN {
            return None;
        }
        let before = self.payload.len();
        let mut limited = std::io::Read::take(r, want as u64);
        let result = std::io::Read::read_to_end(&mut limited, &mut self.payload);
        let got = self.payload.len() - before;
        Some(match result {
            Ok(_) => Ok(got),
            Err(_) if got > 0 => Ok(got),
            Err(e) => Err(e),
        })
    }

    /// The next complete frame, None if more bytes are needed, or the error that makes the
    /// stream unusable (tests and fuzzers: the engine admits frames with `next_frame_if`).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn next_frame(&mut self, limits: &Limits) -> Result<Option<(Header, Vec<u8>)>, WireError> {
        self.next_frame_if(limits, |_| true)
    }

    /// As `next_frame`, and a frame whose header `allowed` refuses is an error
    /// (`Unexpected`) as soon as its header is in: its payload is never collected.
    pub fn next_frame_if(
        &mut self,
        limits: &Limits,
        allowed: impl FnOnce(&Header) -> bool,
    ) -> Result<Option<(Header, Vec<u8>)>, WireError> {
        if self.pending.is_none() {
            if self.buf.len() - self.start < HEADER_LEN {
                return Ok(None);
            }
            let mut hb = [0u8; HEADER_LEN];
            hb.copy_from_slice(&self.buf[self.start..self.start + HEADER_LEN]);
            let h = Header::decode(&hb, limits)?;
            if !allowed(&h) {
                return Err(WireError::Unexpected(h.kind));
            }
            self.start += HEADER_LEN;
            // The length was bounded by `decode`, so this allocation is bounded too.
            self.payload = Vec::with_capacity(h.payload_len as usize);
            self.pending = Some(h);
        }
        let Some(h) = self.pending else {
            return Ok(None);
        };
        let n = (h.payload_len as usize - self.payload.len()).min(self.buf.len() - self.start);
        self.payload
            .extend_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        if self.payload.len() < h.payload_len as usize {
            return Ok(None);
        }
        self.pending = None;
        Ok(Some((h, std::mem::take(&mut self.payload))))
    }
}

/// Frames waiting to be written, kept as the buffers they were built in (no copy into one
/// big buffer); written with gather writes.
#[derive(Default)]
pub struct OutQueue {
    chunks: std::collections::VecDeque<Vec<u8>>,
    front_pos: usize,
    /// Bytes queued and bytes written since the queue was made: positions in the stream.
    pushed: u64,
    written: u64,
    /// ACKs a signal handler answered with but held back, to go out ahead of our next frame
    /// (engine/signalled.rs); ahead of every chunk. Its room is reserved beforehand
    /// (`keep_ack_room`): a handler may not allocate. Bytes before `held_from` are written.
    held: Vec<u8>,
    held_from: usize,
    /// A written chunk kept, emptied, for the next frame's header (`push_frame`): a frame
    /// on its own in the queue, each small send's, then takes no malloc and no free.
    spare: Vec<u8>,
}

/// Small payloads are appended to the previous chunk instead of queued on their own.
const COALESCE_MAX: usize = 4096;
/// ACKs a queue may hold for a signal handler (as many frames as one signal serves).
pub const HELD_ACKS: usize = 16;
/// The largest RDMA read a signal handler answers (its READ_RESP is held with the ACKs).
pub const HELD_ANSWER_MAX: usize = 4096;

impl OutQueue {
    /// Keeps a written chunk of a coalescing size as the spare, if there is none.
    fn keep_spare(&mut self, mut chunk: Vec<u8>) {
        if self.spare.capacity() == 0 && chunk.capacity() <= 2 * COALESCE_MAX {
            chunk.clear();
            self.spare = chunk;
        }
    }

    /// Nothing to write: no chunk, no held ACK.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty() && !self.holds_acks()
    }

    /// Whether ACKs held for a signal handler are still to be written.
    pub fn holds_acks(&self) -> bool {
        self.held_from < self.held.len()
    }

    /// Whether held ACKs are all there is to write.
    pub fn only_held_acks(&self) -> bool {
        self.chunks.is_empty() && self.holds_acks()
    }

    /// Makes sure `hold_ack` can queue `HELD_ACKS` headers, and `hold_answer` one answer of
    /// `HELD_ANSWER_MAX` bytes, without allocating (this may).
    pub fn keep_ack_room(&mut self) {
        const ROOM: usize = HELD_ACKS * HEADER_LEN + HEADER_LEN + HELD_ANSWER_MAX;
        if self.held.capacity() < ROOM && !self.holds_acks() {
            self.held = Vec::with_capacity(ROOM);
            self.held_from = 0;
        }
    }

    /// Holds an answer, header `head` and `len` bytes that `fill` writes (false: it could
    /// not, and nothing is held), behind the held ACKs, allocating nothing: false if no
    /// chunk may be queued before it or there is no room (`keep_ack_room`).
    pub fn hold_answer(
        &mut self,
        head: &[u8; HEADER_LEN],
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> bool {
        let at = self.held.len();
        if !self.chunks.is_empty() || at + HEADER_LEN + len > self.held.capacity() {
            return false;
        }
        self.held.extend_from_slice(head);
        // Within capacity: no allocation.
        self.held.resize(at + HEADER_LEN + len, 0);
        if !fill(&mut self.held[at + HEADER_LEN..]) {
            self.held.truncate(at);
            return false;
        }
        self.pushed += (HEADER_LEN + len) as u64;
        true
    }

    /// Whether `hold_ack` would take a header now, allocating nothing: no chunk queued (a
    /// held ACK goes ahead of them) and room left.
    pub fn can_hold_ack(&self) -> bool {
        self.chunks.is_empty() && self.held.len() + HEADER_LEN <= self.held.capacity()
    }

    /// Holds an ACK (a header) to go out with whatever is written next (see `can_hold_ack`).
    pub fn hold_ack(&mut self, header: &[u8; HEADER_LEN]) {
        debug_assert!(self.can_hold_ack());
        self.held.extend_from_slice(header);
        self.pushed += HEADER_LEN as u64;
    }

    /// Writes the held ACKs alone with `send`, allocating nothing (a signal handler's
    /// flush); what the socket does not take stays held.
    pub fn write_held(
        &mut self,
        send: impl FnOnce(&[std::io::IoSlice<'_>]) -> std::io::Result<usize>,
    ) {
        if !self.holds_acks() {
            return;
        }
        let n = send(&[std::io::IoSlice::new(&self.held[self.held_from..])]).unwrap_or(0);
        self.advance_held(n);
    }

    /// `n` bytes of the held ACKs written: once all are, their room is free again (kept).
    fn advance_held(&mut self, n: usize) -> usize {
        let took = n.min(self.held.len() - self.held_from);
        self.held_from += took;
        self.written += took as u64;
        if self.held_from == self.held.len() {
            self.held.clear();
            self.held_from = 0;
        }
        took
    }

    /// The stream position just after the last byte queued.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// The stream position of the next byte to write (every byte before it was written).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Queues a frame, taking ownership of its payload.
    pub fn push_frame(&mut self, mut header: Header, payload: Vec<u8>) {
        header.payload_len = payload.len() as u32;
        self.pushed += (HEADER_LEN + payload.len()) as u64;
        let hb = header.encode();
        match self.chunks.back_mut() {
            Some(last) if last.len() < COALESCE_MAX => {
                last.extend_from_slice(&hb);
            }
            _ => {
                let mut chunk = std::mem::take(&mut self.spare);
                chunk.extend_from_slice(&hb);
                self.chunks.push_back(chunk);
            }
        }
        if payload.is_empty() {
            return;
        }
        if payload.len() <= COALESCE_MAX {
            if let Some(last) = self.chunks.back_mut() {
                last.extend_from_slice(&payload);
                return;
            }
        }
        self.chunks.push_back(payload);
    }

    /// Queues bytes as they are: the rest of a frame partly written elsewhere (only when the
    /// queue was empty, so the frame's bytes stay in order).
    pub fn push_bytes(&mut self, bytes: Vec<u8>) {
        self.pushed += bytes.len() as u64;
        if !bytes.is_empty() {
            self.chunks.push_back(bytes);
        }
    }

    /// Writes with `send` (a gather write returning the bytes taken: for sockets,
    /// `sys::send_nosignal`, never `Write::write_vectored`, which may raise SIGPIPE) until
    /// everything is written (Ok) or `send` refuses (its error, e.g. WouldBlock).
    pub fn write_with(
        &mut self,
        send: impl FnMut(&[std::io::IoSlice<'_>]) -> std::io::Result<usize>,
    ) -> std::io::Result<()> {
        self.write_upto(u64::MAX, send)
    }

    /// As `write_with`, but stops (Ok) once the stream position `end` is written.
    pub fn write_upto(
        &mut self,
        end: u64,
        mut send: impl FnMut(&[std::io::IoSlice<'_>]) -> std::io::Result<usize>,
    ) -> std::io::Result<()> {
        while !self.is_empty() && self.written < end {
            let mut limit = end - self.written;
            // On the stack: a write is on every send's path, and a list on the heap cost
            // each a malloc and a free.
            let mut slices = [std::io::IoSlice::new(&[]); 17];
            let mut used = 0;
            if self.holds_acks() {
                let held = &self.held[self.held_from..];
                let take = (held.len() as u64).min(limit) as usize;
                slices[used] = std::io::IoSlice::new(&held[..take]);
                used += 1;
                limit -= take as u64;
            }
            for (i, c) in self.chunks.iter().take(16).enumerate() {
                if limit == 0 {
                    break;
                }
                let from = if i == 0 { self.front_pos } else { 0 };
                let take = ((c.len() - from) as u64).min(limit) as usize;
                slices[used] = std::io::IoSlice::new(&c[from..from + take]);
                used += 1;
                limit -= take as u64;
            }
            let mut n = send(&slices[..used])?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            n -= self.advance_held(n);
            self.written += n as u64;
            while n > 0 {
                let Some(front) = self.chunks.front() else {
                    break;
                };
                let left = front.len() - self.front_pos;
                if n >= left {
                    n -= left;
                    if let Some(chunk) = self.chunks.pop_front() {
                        self.keep_spare(chunk);
                    }
                    self.front_pos = 0;
                } else {
                    self.front_pos += n;
                    n = 0;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_message: 1 << 20,
    };

    #[test]
    fn held_acks_go_ahead_of_later_frames() {
        let mut q = OutQueue::default();
        q.keep_ack_room();
        let (mut a1, mut a2) = (Header::new(Kind::Ack), Header::new(Kind::Ack));
        (a1.seq, a2.seq) = (1, 2);
        q.hold_ack(&a1.encode());
        q.hold_ack(&a2.encode());
        assert!(q.only_held_acks());
        q.push_frame(Header::new(Kind::Write), b"data".to_vec());
        assert!(!q.can_hold_ack(), "no ACK is held behind a frame");
        let mut wire = Vec::new();
        // A socket that takes 7 bytes a call.
        q.write_with(|s| {
            let mut took = 0;
            for sl in s {
                let n = sl.len().min(7 - took);
                wire.extend_from_slice(&sl[..n]);
                took += n;
                if took == 7 {
                    break;
                }
            }
            Ok(took)
        })
        .expect("written");
        let mut want = Vec::new();
        want.extend_from_slice(&a1.encode());
        want.extend_from_slice(&a2.encode());
        put_frame(&mut want, Header::new(Kind::Write), b"data");
        assert_eq!(wire, want);
        assert!(q.is_empty() && !q.holds_acks());
        assert_eq!(q.written(), q.pushed());
        assert!(q.can_hold_ack(), "the room is kept");
    }

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
    fn large_payloads_can_be_read_directly() {
        /// A reader handing out at most 50 000 bytes a call, then WouldBlock once.
        struct Chunks<'a>(&'a [u8], bool);
        impl std::io::Read for Chunks<'_> {
            fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
                if self.1 {
                    self.1 = false;
                    return Err(std::io::ErrorKind::WouldBlock.into());
                }
                self.1 = true;
                let n = b.len().min(self.0.len()).min(50_000);
                b[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let big = vec![0x5au8; DIRECT_READ_MIN * 3];
        let mut out = Vec::new();
        put_frame(&mut out, Header::new(Kind::Write), &big);
        let mut d = Decoder::new();
        d.feed(&out[..HEADER_LEN + 10]);
        assert_eq!(d.next_frame(&LIMITS), Ok(None));
        let mut src = Chunks(&out[HEADER_LEN + 10..], false);
        let mut direct = 0;
        while !src.0.is_empty() {
            match d.read_direct(&mut src) {
                Some(Ok(n)) => direct += n,
                Some(Err(e)) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
                None => {
                    let n = src.0.len().min(1000);
                    d.feed(&src.0[..n]);
                    src.0 = &src.0[n..];
                }
            }
            if !src.0.is_empty() {
                assert_eq!(d.next_frame(&LIMITS), Ok(None));
            }
        }
        assert!(direct > 0);
        let (h, p) = d.next_frame(&LIMITS).expect("valid").expect("complete");
        assert_eq!(h.kind, Kind::Write);
        assert_eq!(p, big);
    }

    #[test]
    fn out_queue_writes_frames_in_order_across_short_writes() {
        struct Trickle(Vec<u8>);
        impl std::io::Write for Trickle {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let n = b.len().min(7);
                self.0.extend_from_slice(&b[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut q = OutQueue::default();
        let mut expect = Vec::new();
        for (i, len) in [0usize, 3, 5000, 10, 70_000].into_iter().enumerate() {
            let payload = vec![i as u8; len];
            let mut h = Header::new(Kind::Send);
            h.seq = i as u64;
            put_frame(&mut expect, h, &payload);
            q.push_frame(h, payload);
        }
        let mut w = Trickle(Vec::new());
        q.write_with(|s| std::io::Write::write_vectored(&mut w, s))
            .expect("written");
        assert!(q.is_empty());
        assert_eq!(w.0, expect);
    }

    #[test]
    fn hostile_lengths_are_refused_before_allocation() {
        let mut h = Header::new(Kind::Send);
        h.payload_len = u32::MAX;
        let mut d = Decoder::new();
        d.feed(&h.encode());
        assert!(matches!(
            d.next_frame(&LIMITS),
            Err(WireError::TooLong { .. })
        ));

        let mut h = handshake(Kind::Hello);
        h.payload_len = MAX_PRIVATE_DATA + 1;
        assert!(Header::decode(&h.encode(), &LIMITS).is_err());

        let mut h = Header::new(Kind::Ack);
        h.payload_len = 1;
        assert!(Header::decode(&h.encode(), &LIMITS).is_err());

        let mut h = Header::new(Kind::ReadReq);
        h.length = (1 << 20) + 1;
        assert!(Header::decode(&h.encode(), &LIMITS).is_err());

        // An atomic carries exactly its two operands; a write-with-immediate is bounded as a
        // write.
        let mut h = Header::new(Kind::Atomic);
        h.payload_len = ATOMIC_PAYLOAD + 1;
        assert!(Header::decode(&h.encode(), &LIMITS).is_err());
        h.payload_len = ATOMIC_PAYLOAD;
        assert!(Header::decode(&h.encode(), &LIMITS).is_ok());
        let mut h = Header::new(Kind::WriteImm);
        h.payload_len = LIMITS.max_message + 1;
        assert!(Header::decode(&h.encode(), &LIMITS).is_err());
    }

    #[test]
    fn frames_the_caller_refuses_are_errors_before_their_payload() {
        let mut h = Header::new(Kind::Send);
        h.payload_len = LIMITS.max_message;
        let mut d = Decoder::new();
        d.feed(&h.encode());
        d.feed(&[0u8; 100]);
        assert_eq!(
            d.next_frame_if(&LIMITS, |h| h.kind == Kind::Hello),
            Err(WireError::Unexpected(Kind::Send))
        );
        assert_eq!(d.pending(), None, "no payload is collected for it");
        let mut d = Decoder::new();
        let mut out = Vec::new();
        put_frame(&mut out, handshake(Kind::Hello), b"pd");
        d.feed(&out);
        let (h, p) = d
            .next_frame_if(&LIMITS, |h| h.kind == Kind::Hello)
            .expect("allowed")
            .expect("complete");
        assert_eq!((h.kind, &p[..]), (Kind::Hello, &b"pd"[..]));
    }

    #[test]
    fn out_queue_positions_count_what_was_queued_and_written() {
        let mut q = OutQueue::default();
        q.push_frame(Header::new(Kind::Ack), Vec::new());
        q.push_bytes(vec![1, 2, 3]);
        assert_eq!((q.pushed(), q.written()), (HEADER_LEN as u64 + 3, 0));
        let mut taken = 0;
        q.write_with(|s| {
            let n = s[0].len().min(10);
            taken += n;
            if taken > 20 {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        })
        .expect_err("blocked");
        assert_eq!(q.written(), 20);
        q.write_with(|s| Ok(s.iter().map(|b| b.len()).sum()))
            .expect("written");
        assert_eq!(q.written(), q.pushed());
    }

    #[test]
    fn datagram_headers_round_trip_and_strangers_are_refused() {
        let mut d = ud_header(FLAG_SOLICITED).to_vec();
        d.extend_from_slice(b"payload");
        assert_eq!(ud_parse(&d), Some((FLAG_SOLICITED, &b"payload"[..])));
        let empty = ud_header(0);
        assert_eq!(ud_parse(&empty), Some((0, &b""[..])));
        assert_eq!(ud_parse(&d[..UD_HEADER_LEN - 1]), None);
        let mut wrong = d.clone();
        wrong[0] = b'X';
        assert_eq!(ud_parse(&wrong), None);
        let mut wrong = d.clone();
        wrong[4] = UD_VERSION + 1;
        assert_eq!(ud_parse(&wrong), None);
    }

    #[test]
    fn datagram_messages_fit_one_packet() {
        // Ethernet: 1500 less IPv4 (20), UDP (8) and our header (8).
        assert_eq!(ud_max_message(1500), 1464);
        // Loopback's 65536 is more than a UDP datagram holds.
        assert_eq!(ud_max_message(65536), 65535 - 20 - 8 - 8);
        assert_eq!(ud_max_message(10), 0);
    }

    #[test]
    fn same_host_offers_round_trip_and_other_lengths_are_refused() {
        let o = SameHostOffer {
            ring_fd: Some(9),
            pid: 4242,
            fd: 7,
            nonce: 0x0123_4567_89ab_cdef,
            nonce_addr: 0x7fff_0000_1000,
            pd: 3,
        };
        let b = o.encode();
        assert_eq!(b.len(), SAME_HOST_OFFER_LEN as usize);
        assert_eq!(SameHostOffer::decode(&b), Some(o));
        assert_eq!(SameHostOffer::decode(&b[..31]), None);
        let mut long = b.clone();
        long.push(0);
        assert_eq!(SameHostOffer::decode(&long), None);
        let mut h = Header::new(Kind::SameHost);
        h.payload_len = SAME_HOST_OFFER_LEN + 1;
        assert!(Header::decode(&h.encode(), &LIMITS).is_err());
        h.payload_len = SAME_HOST_OFFER_LEN;
        assert_eq!(Header::decode(&h.encode(), &LIMITS), Ok(h));
    }

    #[test]
    fn garbage_and_wrong_versions_are_errors() {
        let mut b = [0xffu8; HEADER_LEN];
        assert_eq!(
            Header::decode(&b, &LIMITS),
            Err(WireError::UnknownKind(0xff))
        );
        b[0] = Kind::Ack as u8;
        assert_eq!(
            Header::decode(&b, &LIMITS),
            Err(WireError::UnknownStatus(0xff))
        );
        let mut h = handshake(Kind::Hello);
        h.key = VERSION + 1;
        assert_eq!(
            Header::decode(&h.encode(), &LIMITS),
            Err(WireError::BadVersion(VERSION + 1))
        );
        let mut h = handshake(Kind::Hello);
        h.addr = 0;
        assert_eq!(
            Header::decode(&h.encode(), &LIMITS),
            Err(WireError::BadMagic)
        );
    }
}
