//! The device factory: opens a device of either backend from an IA's ia_params. It sits above
//! the backends (it imports both; neither imports it) and above the core, which imports no
//! backend: the C layer hands `open_device` to `Ia::open`, whose IA maps the backend's error to
//! the DAT code.

use std::sync::Arc;

#[cfg(feature = "ofi")]
use crate::backend::ofi;
#[cfg(feature = "verbs")]
use crate::backend::verbs;
use crate::backend::{tcp, Device, Error, Result};

/// Opens the device named by an IA's ia_params, e.g. "tcp lo", "tcp eth0", "tcp 127.0.0.1".
/// The words of `ia_params`: transport, target, and an optional third word (the port of a
/// verbs device). Defaults: "tcp lo".
pub(crate) fn parse_ia_params(ia_params: &str) -> (&str, &str, Option<&str>) {
    let mut words = ia_params.split_whitespace();
    (
        words.next().unwrap_or("tcp"),
        words.next().unwrap_or("lo"),
        words.next(),
    )
}

/// The words of "ofi <provider> [<where>] [dgram=<provider>]" after the provider: where,
/// and the libfabric provider of its datagram EPs (docs/libfabric.md, Datagrams).
#[cfg(feature = "ofi")]
pub(crate) fn ofi_options(ia_params: &str) -> (Option<&str>, Option<&str>) {
    ofi::entry_options(ia_params.split_whitespace().skip(2))
}

/// Opens the device named by an IA's ia_params: "tcp lo", "tcp eth0", "tcp 127.0.0.1", and in
/// a provider built with the verbs backend "verbs rxe0 1", "verbs eth2", "verbs 192.0.2.1", and
/// in one built with the libfabric backend "ofi tcp lo", "ofi tcp 127.0.0.1", "ofi verbs rxe0"
/// (a libfabric provider and where: an interface, an address or the provider's domain;
/// "ofi tcp;ofi_rxm 127.0.0.1 dgram=udp" adds datagram EPs over libfabric's udp).
pub fn open_device(ia_params: &str) -> Result<Arc<dyn Device>> {
    match parse_ia_params(ia_params) {
        ("tcp", target, _) => {
            let device = tcp::TcpDevice::open(target)?;
            Ok(device)
        }
        #[cfg(feature = "verbs")]
        ("verbs", target, port) => {
            let device = verbs::VerbsDevice::open(target, port)?;
            Ok(device)
        }
        #[cfg(feature = "ofi")]
        ("ofi", provider, _) => {
            let (place, dgram) = ofi_options(ia_params);
            let device = ofi::OfiDevice::open_with(provider, place, dgram)?;
            Ok(device)
        }
        _ => Err(Error::NoDevice),
    }
}

/// Why `ia_params` name no usable device, in words (None when they do):
/// what `datinfo` and the provider's one-line warning tell a user whose
/// dat.conf says "tcp eth7".
pub fn diagnose(ia_params: &str) -> Option<String> {
    match parse_ia_params(ia_params) {
        ("tcp", target, _) => tcp::resolve_address(target).err(),
        #[cfg(feature = "verbs")]
        ("verbs", target, port) => verbs::diagnose(target, port),
        #[cfg(not(feature = "verbs"))]
        ("verbs", _, _) => Some(
            "this provider library has no verbs backend: name libdaplrs-verbs.so.2 in dat.conf \
             for \"verbs ...\" entries"
                .to_string(),
        ),
        #[cfg(feature = "ofi")]
        ("ofi", provider, _) => {
            let (place, dgram) = ofi_options(ia_params);
            ofi::OfiDevice::diagnose_with(provider, place, dgram)
        }
        #[cfg(not(feature = "ofi"))]
        ("ofi", _, _) => Some(
            "this provider library has no libfabric backend: name libdaplrs-ofi.so.2 in dat.conf \
             for \"ofi ...\" entries"
                .to_string(),
        ),
        (other, _, _) => Some(format!(
            "unknown transport '{other}' in ia_params (expected \"tcp <interface or IPv4 \
             address>\", \"verbs <device> [port] | <netdev> | <IPv4 address>\" or \"ofi <libfabric \
             provider> [interface | IPv4 address | domain]\")"
        )),
    }
}

#[cfg(all(test, feature = "ofi"))]
mod tests {
    use super::ofi_options;

    #[test]
    fn an_ofi_entry_names_where_and_its_datagram_provider_in_any_order() {
        assert_eq!(ofi_options("ofi tcp lo"), (Some("lo"), None));
        assert_eq!(ofi_options("ofi shm"), (None, None));
        assert_eq!(ofi_options("ofi shm dgram=udp"), (None, Some("udp")));
        assert_eq!(
            ofi_options("ofi tcp;ofi_rxm 127.0.0.1 dgram=udp"),
            (Some("127.0.0.1"), Some("udp"))
        );
        assert_eq!(
            ofi_options("ofi verbs;ofi_rxm dgram=verbs rxe0"),
            (Some("rxe0"), Some("verbs"))
        );
    }
}
