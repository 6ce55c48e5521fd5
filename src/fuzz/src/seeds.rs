//! Built-in seeds: valid inputs of every target, the wire ones made by our own encoder (every
//! frame kind), so that mutation starts from what a real peer or a real dat.conf looks like.
//! `datfuzz --write-corpus` writes them to fuzz/corpus/<target>/ for cargo-fuzz as well.

use crate::engine::{BIG_READ, KEY_MARK};
use daplrs::backend::tcp::wire::{self, Header, Kind, Status};

/// Debian's /etc/dat.conf shape (OFED's providers) and the repository's entries.
const DAT_CONFS: &[&str] = &[
    include_str!("../../../dat.conf"),
    "# DAT v2.0\n#\n\
     ofa-v2-mlx4_0-1 u2.0 nonthreadsafe default libdaploscm.so.2 dapl.2.0 \"mlx4_0 1\" \"\"\n\
     ofa-v2-ib0 u2.0 nonthreadsafe default libdaplofa.so.2 dapl.2.0 \"ib0 0\" \"\"\n\
     ofa-v2-iwarp u2.0 nonthreadsafe default libdaplofa.so.2 dapl.2.0 \"eth2 0\" \"\"\n\
     ofa-v2-mlx4_0-1u u2.0 nonthreadsafe default libdaploucm.so.2 dapl.2.0 \"mlx4_0 1\" \"\"\n\
     OpenIB-cma u1.2 nonthreadsafe default libdaplcma.so.1 dapl.1.2 \"ib0 0\" \"\"\n",
    "a\tk1.2 threadsafe nondefault /x/lib.so p.1.2 \"\" \"y z\" # tail\r\n",
    "bad u2.0 maybe default lib dapl.2.0 \"\" \"\"\nw u2.0 nonthreadsafe default lib dapl.2.0 \"open \"\"\n",
];

const IA_PARAMS: &[&str] = &[
    "tcp lo",
    "tcp 127.0.0.1",
    "tcp eth0",
    "tcp 192.0.2.1",
    "verbs rxe0 1",
    "verbs eth2",
    "verbs 192.0.2.1",
    "ib0 0",
    "mlx4_0 1",
    "",
    "tcp",
    "  tcp\tlo  extra words ",
];

fn frame(out: &mut Vec<u8>, h: Header, payload: &[u8]) {
    wire::put_frame(out, h, payload);
}

fn req(kind: Kind, seq: u64, addr: u64, key: u32, length: u32) -> Header {
    let mut h = Header::new(kind);
    h.seq = seq;
    h.addr = addr;
    h.key = key;
    h.length = length;
    h
}

/// One frame of every kind (statuses and flags varied), as a peer would send them.
fn every_frame() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut one = |h: Header, p: &[u8]| {
        let mut v = Vec::new();
        frame(&mut v, h, p);
        out.push(v);
    };
    one(wire::handshake(Kind::Hello), b"private data");
    let mut ud = wire::handshake(Kind::Hello);
    ud.flags = wire::FLAG_UD;
    ud.length = 4791;
    one(ud, b"");
    one(wire::handshake(Kind::Accept), b"welcome");
    let mut rej = Header::new(Kind::Reject);
    rej.status = Status::BadVersion;
    one(rej, b"no");
    let mut send = req(Kind::Send, 1, 0, 0, 0);
    send.flags = wire::FLAG_SOLICITED;
    one(send, b"a message");
    one(req(Kind::Write, 2, 1024, KEY_MARK, 0), &[7u8; 40]);
    one(req(Kind::ReadReq, 3, 1100, KEY_MARK, 64), b"");
    let mut rr = Header::new(Kind::ReadResp);
    rr.seq = 3;
    one(rr, &[1u8; 64]);
    let mut ack = Header::new(Kind::Ack);
    ack.seq = 1;
    ack.status = Status::RemoteAccess;
    one(ack, b"");
    one(Header::new(Kind::Disconnect), b"");
    one(req(Kind::WriteImm, 4, 2000, KEY_MARK, 0xabcd), &[9u8; 16]);
    let mut at = req(Kind::Atomic, 5, 2048, KEY_MARK, 0);
    at.flags = wire::FLAG_FETCH_ADD;
    one(at, &[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let mut inv = req(Kind::Send, 6, 0, KEY_MARK, 0);
    inv.flags = wire::FLAG_INVALIDATE;
    one(inv, b"inv");
    let offer = wire::SameHostOffer {
        pid: 1,
        fd: 3,
        nonce: 0x5eed,
        nonce_addr: 0x1000,
        pd: 1,
        ring_fd: Some(4),
    };
    one(Header::new(Kind::SameHost), &offer.encode());
    one(Header::new(Kind::Switch), &[]);
    one(Header::new(Kind::Doorbell), &[]);
    let mut same_host = wire::handshake(Kind::Hello);
    same_host.flags = wire::FLAG_SAME_HOST;
    one(same_host, b"same host");
    out
}

/// What a peer sends a target: a HELLO, then requests.
fn target_streams() -> Vec<Vec<u8>> {
    let frames = every_frame();
    let mut hello = Vec::new();
    frame(&mut hello, wire::handshake(Kind::Hello), b"fuzz");
    let mut out = vec![hello.clone()];
    // HELLO + each request kind alone (SEND, WRITE, READ_REQ, ..., DISCONNECT, garbage).
    for f in frames.iter().skip(4) {
        let mut s = hello.clone();
        s.extend_from_slice(f);
        out.push(s);
    }
    // HELLO + a legitimate exchange: a send, a write, a read of it, an atomic, goodbye.
    let mut s = hello.clone();
    frame(&mut s, req(Kind::Send, 1, 0, 0, 0), b"hi");
    frame(&mut s, req(Kind::Write, 2, 1024, KEY_MARK, 0), &[5u8; 100]);
    frame(&mut s, req(Kind::ReadReq, 3, 1024, KEY_MARK, 100), b"");
    let mut at = req(Kind::Atomic, 4, 1032, KEY_MARK, 0);
    at.flags = wire::FLAG_CMP_SWAP;
    frame(&mut s, at, &[5u8; 16]);
    frame(&mut s, req(Kind::WriteImm, 5, 1200, KEY_MARK, 77), b"imm");
    frame(&mut s, Header::new(Kind::Disconnect), b"");
    out.push(s);
    // Violations: outside the region, unknown key, a read too long.
    let mut s = hello.clone();
    frame(&mut s, req(Kind::Write, 1, 1000, KEY_MARK, 0), &[1u8; 40]);
    out.push(s);
    let mut s = hello.clone();
    frame(&mut s, req(Kind::ReadReq, 1, 3000, KEY_MARK, 200), b"");
    out.push(s);
    let mut s = hello;
    frame(&mut s, req(Kind::Write, 1, 0x1000, 12345, 0), &[1u8; 8]);
    out.push(s);
    out
}

/// What a target answers an initiator that posts a send (seq 1), an RDMA write (2), an RDMA
/// read of 64 bytes (3) and one of 64 KiB (4).
fn initiator_streams() -> Vec<Vec<u8>> {
    let mut accept = Vec::new();
    frame(&mut accept, wire::handshake(Kind::Accept), b"ok");
    let mut out = vec![accept.clone()];
    let mut rej = Vec::new();
    frame(&mut rej, Header::new(Kind::Reject), b"go away");
    out.push(rej);
    let ack = |seq: u64, status: Status| {
        let mut h = Header::new(Kind::Ack);
        h.seq = seq;
        h.status = status;
        h
    };
    let mut s = accept.clone();
    frame(&mut s, ack(1, Status::Ok), b"");
    frame(&mut s, ack(2, Status::Ok), b"");
    let mut rr = Header::new(Kind::ReadResp);
    rr.seq = 3;
    frame(&mut s, rr, &[3u8; 64]);
    let short = s.clone();
    // The large read's answer, received straight into the read's buffer.
    rr.seq = 4;
    frame(&mut s, rr, &vec![4u8; BIG_READ as usize]);
    frame(&mut s, Header::new(Kind::Disconnect), b"");
    out.push(s);
    // ... cut short, and declared longer than the read.
    let mut cut = short.clone();
    rr.payload_len = BIG_READ;
    cut.extend_from_slice(&rr.encode());
    cut.extend_from_slice(&[4u8; 1000]);
    out.push(cut);
    let mut long = short;
    rr.payload_len = BIG_READ + 1;
    long.extend_from_slice(&rr.encode());
    long.extend_from_slice(&[4u8; 1000]);
    out.push(long);
    let mut s = accept.clone();
    frame(&mut s, ack(1, Status::RemoteLength), b"");
    out.push(s);
    let mut s = accept.clone();
    frame(&mut s, ack(2, Status::Ok), b"");
    out.push(s);
    // The target sends requests of its own to the initiator's IA.
    for f in every_frame().iter().skip(4) {
        let mut s = accept.clone();
        s.extend_from_slice(f);
        out.push(s);
    }
    out
}

/// The built-in seeds of a target.
pub fn for_target(name: &str) -> Vec<Vec<u8>> {
    match name {
        "conf" => DAT_CONFS.iter().map(|s| s.as_bytes().to_vec()).collect(),
        "ia_params" => IA_PARAMS.iter().map(|s| s.as_bytes().to_vec()).collect(),
        "wire_header" => every_frame()
            .into_iter()
            .map(|f| f[..wire::HEADER_LEN].to_vec())
            .collect(),
        "wire_stream" => {
            let mut all = vec![0u8];
            for f in every_frame() {
                all.extend_from_slice(&f);
            }
            let mut out = vec![all];
            for f in every_frame() {
                let mut s = vec![5u8];
                s.extend_from_slice(&f);
                out.push(s);
            }
            out
        }
        "wire_roundtrip" => vec![
            vec![
                0, 4, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
            ],
            (0u8..=255).collect(),
            vec![0xff; 64],
        ],
        "ud_datagram" => {
            let mut d = wire::ud_header(wire::FLAG_SOLICITED).to_vec();
            d.extend_from_slice(b"payload");
            vec![d, wire::ud_header(0).to_vec()]
        }
        "engine_datagram" => {
            let mut ours = wire::ud_header(wire::FLAG_SOLICITED).to_vec();
            ours.extend_from_slice(b"a datagram");
            let mut both = Vec::new();
            for d in [&ours[..], b"not ours", &wire::ud_header(0)[..]] {
                both.extend_from_slice(&(d.len() as u16).to_le_bytes());
                both.extend_from_slice(d);
            }
            vec![both, Vec::new()]
        }
        "engine_target" => target_streams(),
        "engine_initiator" => initiator_streams(),
        _ => Vec::new(),
    }
}
