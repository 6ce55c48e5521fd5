//! Entry points for the fuzzers (`src/fuzz`, the stable in-house fuzzer run by `cargo test`
//! and `make fuzz`; `fuzz/`, the cargo-fuzz targets for a nightly toolchain): each takes bytes
//! from outside and feeds them to one parser of the provider, checking what must hold for any
//! input. A violated property panics (the fuzzer's crash); a hang is caught by the generous
//! waits of the engine harnesses, which panic too.
//!
//! The functions return a small "outcome class" (which error, which frame kinds, which
//! events): the in-house fuzzer, having no coverage instrumentation on stable Rust, keeps an
//! input that produced a class it had not seen, as a cheap stand-in for new coverage.
//!
//! Not an API: hidden from the docs, and nothing but the fuzzers calls it.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use crate::backend::tcp::wire::{self, Decoder, Header, Kind, Limits, Status, HEADER_LEN};

pub use datagram::EngineDatagram;
pub use engine::{EngineInitiator, EngineTarget, BIG_READ, KEY_MARK};

/// The limits a TCP device enforces (the wire bound on payloads).
pub const LIMITS: Limits = Limits {
    max_message: crate::backend::tcp::MAX_MESSAGE,
};

/// The variant of a wire error, without its values (an outcome class, not one per length).
fn error_name(e: &wire::WireError) -> String {
    format!("{e:?}")
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("")
        .to_string()
}

fn class_of(x: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    x.hash(&mut h);
    h.finish()
}

/// The payload bound of a frame kind (docs/wire-protocol.md, "Bounds").
pub fn payload_bound(kind: Kind, limits: &Limits) -> u32 {
    match kind {
        Kind::Hello | Kind::Accept | Kind::Reject => wire::MAX_PRIVATE_DATA,
        Kind::Send | Kind::Write | Kind::WriteImm | Kind::ReadResp => limits.max_message,
        Kind::Atomic => wire::ATOMIC_PAYLOAD,
        Kind::SameHost => wire::SAME_HOST_OFFER_LEN,
        Kind::ReadReq
        | Kind::Ack
        | Kind::Disconnect
        | Kind::Switch
        | Kind::Doorbell
        | Kind::Placed => 0,
    }
}

const KINDS: [Kind; 15] = [
    Kind::Hello,
    Kind::Accept,
    Kind::Reject,
    Kind::Send,
    Kind::Write,
    Kind::ReadReq,
    Kind::ReadResp,
    Kind::Ack,
    Kind::Disconnect,
    Kind::WriteImm,
    Kind::Atomic,
    Kind::SameHost,
    Kind::Switch,
    Kind::Doorbell,
    Kind::Placed,
];
const STATUSES: [Status; 5] = [
    Status::Ok,
    Status::RemoteAccess,
    Status::RemoteLength,
    Status::RemoteInvalid,
    Status::BadVersion,
];

/// Whether a header satisfies every documented bound (what `Header::decode` must accept).
fn within_bounds(h: &Header, limits: &Limits) -> bool {
    h.payload_len <= payload_bound(h.kind, limits)
        && !(h.kind == Kind::ReadReq && h.length > limits.max_message)
        && !(matches!(h.kind, Kind::Hello | Kind::Accept)
            && (h.addr != wire::MAGIC || h.key != wire::VERSION))
}

/// A 32-byte header as received: decoded, then (if accepted) within its bounds and encoded
/// back to the same bytes.
pub fn wire_header(data: &[u8]) -> u64 {
    let mut b = [0u8; HEADER_LEN];
    let n = data.len().min(HEADER_LEN);
    b[..n].copy_from_slice(&data[..n]);
    match Header::decode(&b, &LIMITS) {
        Ok(h) => {
            assert!(within_bounds(&h, &LIMITS), "accepted out of bounds: {h:?}");
            assert_eq!(h.encode(), b, "decode then encode changed the header");
            class_of((0u8, h.kind as u8, h.status as u8))
        }
        Err(e) => class_of((1u8, error_name(&e))),
    }
}

/// Little-endian reader over fuzz input that yields zeros past its end.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let n = self.0.len().min(N);
        a[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        a
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

/// Frames built from the input (every kind and status, any field values, payloads up to a
/// few hundred bytes; HELLO/ACCEPT/REJECT carry the private data): encoded with our encoder,
/// decoded by the stream decoder fed in input-chosen pieces. Round trip: a frame within its
/// bounds decodes to itself; one outside them is refused before anything after it is
/// returned.
pub fn wire_roundtrip(data: &[u8]) -> u64 {
    let mut r = Bytes(data);
    let limits = Limits {
        max_message: 1 + u32::from(r.u16()) % 512,
    };
    let mut frames = Vec::new();
    let mut stream = Vec::new();
    while !r.0.is_empty() && frames.len() < 32 {
        let sel = r.u8();
        let mut h = Header::new(KINDS[usize::from(sel % 11)]);
        h.status = STATUSES[usize::from(sel / 11 % 5)];
        h.flags = r.u16();
        let magic = r.u8();
        h.addr = if magic & 1 == 0 { wire::MAGIC } else { r.u64() };
        h.key = if magic & 2 == 0 {
            wire::VERSION
        } else {
            r.u32()
        };
        h.length = if magic & 4 == 0 {
            u32::from(r.u16())
        } else {
            r.u32()
        };
        h.seq = r.u64();
        let len = usize::from(r.u16() % 600).min(r.0.len());
        let payload = r.0[..len].to_vec();
        r.0 = &r.0[len..];
        h.payload_len = len as u32;
        wire::put_frame(&mut stream, h, &payload);
        frames.push((h, payload));
    }
    let mut d = Decoder::new();
    let mut got = Vec::new();
    let mut err = None;
    let mut pos = 0;
    let mut step = 1 + data.first().copied().unwrap_or(0) as usize;
    'feed: while pos < stream.len() {
        let n = step.min(stream.len() - pos);
        d.feed(&stream[pos..pos + n]);
        pos += n;
        step = step * 7 % 97 + 1;
        loop {
            match d.next_frame(&limits) {
                Ok(Some(f)) => got.push(f),
                Ok(None) => break,
                Err(e) => {
                    err = Some(e);
                    break 'feed;
                }
            }
        }
    }
    let good = frames
        .iter()
        .take_while(|(h, _)| within_bounds(h, &limits))
        .count();
    assert_eq!(got.len(), good, "frames decoded");
    for (i, ((h, p), (gh, gp))) in frames.iter().zip(&got).enumerate() {
        assert_eq!((h, p), (gh, gp), "frame {i} did not round-trip");
    }
    assert_eq!(err.is_some(), good < frames.len(), "refusal: {err:?}");
    class_of((
        got.iter().map(|(h, _)| h.kind as u8).collect::<Vec<_>>(),
        err.map(|e| error_name(&e)),
    ))
}

/// Raw bytes from a peer, fed to the stream decoder in input-chosen pieces: no panic, no
/// payload over its kind's bound, every frame encodes back to exactly the bytes it came from,
/// feeding in pieces gives what feeding at once gives, nothing buffered beyond the input.
pub fn wire_stream(data: &[u8]) -> u64 {
    let (split, stream) = match data.split_first() {
        Some((s, rest)) => (*s, rest),
        None => (0, data),
    };
    let limits = Limits {
        max_message: 1 << 16,
    };
    let decode = |piece: usize| {
        let mut d = Decoder::new();
        let mut frames = Vec::new();
        let mut pos = 0;
        let mut err = None;
        'feed: while pos < stream.len() {
            let n = piece.min(stream.len() - pos);
            d.feed(&stream[pos..pos + n]);
            pos += n;
            assert!(d.buffered() <= stream.len(), "buffered more than was fed");
            loop {
                match d.next_frame(&limits) {
                    Ok(Some(f)) => frames.push(f),
                    Ok(None) => break,
                    Err(e) => {
                        err = Some(e);
                        break 'feed;
                    }
                }
            }
        }
        (frames, err)
    };
    let (frames, err) = decode(1 + usize::from(split));
    let (whole, whole_err) = decode(stream.len().max(1));
    assert_eq!(frames, whole, "pieces and whole disagree");
    assert_eq!(err, whole_err, "pieces and whole disagree on the error");
    let mut again = Vec::new();
    for (h, p) in &frames {
        assert!(p.len() as u32 <= payload_bound(h.kind, &limits));
        assert!(p.capacity() <= payload_bound(h.kind, &limits).max(1) as usize);
        wire::put_frame(&mut again, *h, p);
    }
    assert_eq!(
        &stream[..again.len()],
        &again[..],
        "frames do not re-encode to their bytes"
    );
    class_of((
        frames.iter().map(|(h, _)| h.kind as u8).collect::<Vec<_>>(),
        err.map(|e| error_name(&e)),
    ))
}

/// A datagram from anyone: parsed or dropped; a parsed one is our header (its reserved
/// bytes aside) and the message, which re-encode to it.
pub fn ud_datagram(data: &[u8]) -> u64 {
    match wire::ud_parse(data) {
        Some((flags, msg)) => {
            assert!(flags <= 0xff);
            let mut again = wire::ud_header(flags).to_vec();
            again.extend_from_slice(msg);
            let mut want = data.to_vec();
            want[6] = 0;
            want[7] = 0;
            assert_eq!(again, want);
            class_of((1u8, flags))
        }
        None => {
            assert!(
                data.len() < wire::UD_HEADER_LEN
                    || data[..4] != wire::UD_MAGIC
                    || data[4] != wire::UD_VERSION
            );
            class_of(0u8)
        }
    }
}

/// The dat.conf `ia_params` of an entry ("tcp lo", "tcp 127.0.0.1", "verbs rxe0 1", ...):
/// split into words and diagnosed (what datinfo and a failing dat_ia_open report: resolving
/// the address, listing the interfaces). No panic, and every word comes from the input.
pub fn ia_params(data: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(data);
    let (transport, target, port) = crate::device::parse_ia_params(&text);
    for w in [transport, target].into_iter().chain(port) {
        assert!(
            w == "tcp" || w == "lo" || text.split_whitespace().any(|x| x == w),
            "word '{w}' not from the input"
        );
    }
    let verdict = crate::device::diagnose(&text);
    class_of((transport.len().min(8), port.is_some(), verdict.is_none()))
}

mod datagram;
mod engine;
