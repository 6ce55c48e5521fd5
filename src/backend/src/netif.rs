//! The host's IPv4 interfaces: what the second word of an IA's ia_params names (an interface or
//! an address), for the TCP backend, the verbs backend (the address of a port's netdev) and the
//! device factory's diagnosis.

use std::ffi::{CStr, CString};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};

/// Resolves the second word of ia_params: an IPv4 address assigned to this host, or the name
/// of an interface with an IPv4 address. The error says why not, for datinfo.
pub fn resolve_address(target: &str) -> Result<Ipv4Addr, String> {
    if let Ok(addr) = target.parse::<Ipv4Addr>() {
        // Binding proves the address is configured on this host.
        return match UdpSocket::bind(SocketAddrV4::new(addr, 0)) {
            Ok(_) => Ok(addr),
            Err(e) => Err(format!(
                "address {addr} is not configured on this host: {e}"
            )),
        };
    }
    match interface_ipv4(target) {
        Ok(Some(a)) => Ok(a),
        Ok(None) => Err(format!(
            "interface {target} does not exist or has no IPv4 address"
        )),
        Err(e) => Err(format!("cannot list interfaces: {e}")),
    }
}

/// The IPv4 address of network interface `name`, if it has one.
pub fn interface_ipv4(name: &str) -> io::Result<Option<Ipv4Addr>> {
    Ok(ipv4_interfaces()?
        .into_iter()
        .find(|(n, _)| n.to_bytes() == name.as_bytes())
        .map(|(_, a)| a))
}

/// Every (interface name, IPv4 address) pair of this host.
pub fn ipv4_interfaces() -> io::Result<Vec<(CString, Ipv4Addr)>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned and we have not freed it.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_name.is_null() || ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr of at least sa_family.
        let family = unsafe { (*ifa.ifa_addr).sa_family };
        if i32::from(family) == libc::AF_INET {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let ifname = unsafe { CStr::from_ptr(ifa.ifa_name) };
            // SAFETY: for AF_INET the sockaddr is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            found.push((
                ifname.to_owned(),
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
            ));
        }
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}

/// The network interface port `port` of RDMA device `device` ("rxe0") sits on, as sysfs
/// lists it (the lowest GID index that names one), with that GID index; None for a device
/// or port with none (InfiniBand) or that is not there.
pub fn rdma_port_netdev(device: &str, port: u8) -> Option<(u32, String)> {
    if device.contains('/') {
        return None;
    }
    let ndevs = std::path::Path::new("/sys/class/infiniband")
        .join(format!("{device}/ports/{port}/gid_attrs/ndevs"));
    let mut idx: Vec<u32> = std::fs::read_dir(&ndevs)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect();
    idx.sort();
    idx.into_iter().find_map(|i| {
        let n = std::fs::read_to_string(ndevs.join(i.to_string())).ok()?;
        let n = n.trim();
        (!n.is_empty()).then(|| (i, n.to_string()))
    })
}
