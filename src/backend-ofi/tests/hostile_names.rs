//! A connection request over reliable datagrams carries the requester's
//! fabric address, which the accepting side hands to `fi_av_insert`: a
//! provider reads as many bytes as its addresses have (shm: a string, up to
//! its NUL) and trusts them. A request whose address is too short, or a
//! string with no end, is refused at the accept instead of being read past
//! its end; a well-formed connection made after it still connects.

mod common;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};

use common::{connect_via, event, one_device, qp};
use daplrs_backend::{CmEvent, Device};

/// One handshake frame as the backend's connection layer writes it: its
/// kind, the number of fields, each as a 32-bit length and its bytes.
fn frame(kind: u8, fields: &[&[u8]]) -> Vec<u8> {
    let mut v = vec![kind, fields.len() as u8];
    for f in fields {
        v.extend_from_slice(&(f.len() as u32).to_le_bytes());
        v.extend_from_slice(f);
    }
    v
}

/// A request from a peer naming itself `name`: the connection layer's magic,
/// the provider, the name, the header of ours (no key table, no private
/// data, a key table to map that is none: pid 1's descriptor 0, token 0) and
/// its connection id.
fn hostile_request(provider: &str, name: &[u8]) -> Vec<u8> {
    let layer_magic = [b'D', b'R', b'S', b'R', 0, 4, 0, 0];
    let mut header = vec![b'D', b'R', b'O', 4];
    header.resize(32, 0);
    header.extend_from_slice(&1u32.to_le_bytes());
    header.resize(48, 0);
    let tag = 7u64.to_le_bytes();
    frame(
        b'Q',
        &[&layer_magic, provider.as_bytes(), name, &header, &tag],
    )
}

fn refused_then_legitimate(provider: &str, name: &[u8]) {
    let (dev, rx) = one_device(provider);
    let listener = dev.listen(0).unwrap();
    let at = SocketAddrV4::new(Ipv4Addr::LOCALHOST, listener.port());
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();

    let mut s = TcpStream::connect(at).unwrap();
    s.write_all(&hostile_request(provider, name)).unwrap();
    let req = match event(&rx) {
        CmEvent::ConnectRequest { req, .. } => req,
        e => panic!("{e:?}"),
    };
    let victim = qp(&dev, &pd, &cq);
    assert!(
        dev.accept(req, &victim, b"").is_err(),
        "{provider}: a request naming {name:?} was accepted"
    );
    victim.destroy();
    drop(s);

    let (a, b) = (qp(&dev, &pd, &cq), qp(&dev, &pd, &cq));
    connect_via(&dev, &rx, at, &a, &b);
    a.destroy();
    b.destroy();
    listener.close();
    dev.close();
}

#[test]
fn a_short_address_is_refused_over_rxm() {
    refused_then_legitimate("tcp;ofi_rxm", b"abc");
}

#[test]
fn an_address_string_with_no_end_is_refused_over_shm() {
    refused_then_legitimate("shm", b"fi_shm://no-terminator");
}
