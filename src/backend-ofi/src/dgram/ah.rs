//! A datagram address handle: where datagrams to a remote QP go.

use std::net::Ipv4Addr;

use daplrs_backend::AddressHandle;

/// A remote QP as a resolution gave it: its endpoint's address in the
/// datagram domain's AV, the IA address behind it and its QP number.
/// Nothing to release: the AV keeps the peer for the device's life.
pub(crate) struct OfiAh {
    pub addr: Ipv4Addr,
    pub fi_addr: u64,
    pub qpn: u32,
}

impl AddressHandle for OfiAh {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn address(&self) -> Ipv4Addr {
        self.addr
    }
}
