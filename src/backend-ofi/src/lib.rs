//! The libfabric (OFI) backend: the verbs-shaped backend trait over libfabric
//! endpoints. The mapping, and why, is docs/libfabric.md.
//!
//! This crate today: connected endpoints (`FI_EP_MSG`: libfabric's tcp and
//! verbs providers) and reliable datagrams with a connection layer of our own
//! (`FI_EP_RDM`: shm, tcp;ofi_rxm; `rdm`, one handshake thread per device),
//! their endpoints shared by the QPs of an EVD set and messages told apart
//! by tag (`port`; short ones land in the port's eager buffers, `eager`), sends, receives, RDMA reads and writes, memory windows (a
//! registration per bind), immediate data, shared receive queues (`srq`: the
//! provider's shared receive context where it has one, else a pool of ours
//! fed through bounce buffers, `bounce`), and a progress thread that
//! sleeps on the provider's wait descriptors (`wait`); 64-bit fetch-and-add
//! and compare-and-swap where the provider has them (`Domain::atomics`);
//! datagram QPs over a second provider's `FI_EP_DGRAM` endpoints where the
//! entry names one (`dgram=udp`: `dgram`, their addresses exchanged over the
//! reliable-datagram handshake, `rdm::ud`). Remote virtual addresses are
//! translated for providers that address registrations by offset (`keys`).
//! On shm, a thread releases the locks a killed peer left held in shm's
//! shared memory (`left_locks`).
#![deny(unsafe_op_in_unsafe_fn)]

mod arenas;
mod bounce;
pub mod catalog;
mod cm;
mod cq;
mod device;
mod dgram;
mod domain;
mod eager;
mod environ;
mod farewell;
mod keymap;
mod keys;
mod left_locks;
mod mem;
mod port;
mod qp;
mod rdm;
mod ready;
mod reap;
mod srq;
mod wait;
mod wire;

pub use device::OfiDevice;

use std::net::Ipv4Addr;

use daplrs_backend::{Error, Resource};
use ofi_sys as fi;

/// An open libfabric object, closed when dropped. libfabric objects of a
/// `FI_THREAD_SAFE` domain may be used from any thread.
pub(crate) struct Fid<T>(*mut T);

// SAFETY: the domain is opened FI_THREAD_SAFE: its objects may be used and
// closed from any thread.
unsafe impl<T> Send for Fid<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Fid<T> {}

impl<T> Fid<T> {
    pub(crate) fn ptr(&self) -> *mut T {
        self.0
    }

    /// The object's `struct fid` (every libfabric object begins with one).
    pub(crate) fn fid(&self) -> *mut fi::fid {
        self.0.cast()
    }
}

impl<T> Drop for Fid<T> {
    fn drop(&mut self) {
        // SAFETY: the object is open (Fid owns it) and closed exactly once, here.
        let rc = unsafe { fi::fi_close(self.fid()) };
        if rc != 0 {
            log::warn!("fi_close: {}", fi::strerror(rc));
        }
    }
}

/// An `fi_info` list we own, freed when dropped.
pub(crate) struct Info(*mut fi::fi_info);

// SAFETY: an fi_info is plain data; we only read it after fi_getinfo returned it.
unsafe impl Send for Info {}
// SAFETY: as above.
unsafe impl Sync for Info {}

impl Info {
    pub(crate) fn ptr(&self) -> *mut fi::fi_info {
        self.0
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: the list came from fi_getinfo (or a CM event) and is freed once.
        unsafe { fi::fi_freeinfo(self.0) };
    }
}

/// A libfabric return code as the backend's error, logging what failed.
pub(crate) fn check(rc: isize, what: &str, otherwise: Error) -> Result<isize, Error> {
    if rc >= 0 {
        return Ok(rc);
    }
    if -rc as u32 == fi::FI_EAGAIN {
        // A busy provider (ofi_rxm connecting underneath, a full queue): the
        // caller holds the request and tries again, nothing failed.
        log::debug!("{what}: {}", fi::strerror(rc as i32));
    } else {
        log::warn!("{what}: {}", fi::strerror(rc as i32));
    }
    let e = match -rc as u32 {
        fi::FI_ENOMEM => Error::NoResource(Resource::Memory),
        fi::FI_EAGAIN => Error::NoResource(Resource::WorkQueue),
        fi::FI_ENOSYS | fi::FI_EOPNOTSUPP => Error::Unsupported,
        fi::FI_EADDRINUSE => Error::AddrInUse,
        fi::FI_ENODATA | fi::FI_ENODEV => Error::NoDevice,
        _ => otherwise,
    };
    Err(out_of_descriptors_said(e))
}

/// `e`, or a lack of resources where the process has no file descriptor left: a provider
/// that could not open one says so in its own words (verbs opening an endpoint: ENODATA,
/// "no device"), and DAT's answer is DAT_INSUFFICIENT_RESOURCES (test_resources).
pub(crate) fn out_of_descriptors_said(e: Error) -> Error {
    match e {
        Error::NoResource(_) => e,
        _ if domain::out_of_descriptors() => Error::NoResource(Resource::Host),
        _ => e,
    }
}

/// Checks a libfabric call made while opening an object.
pub(crate) fn opened(rc: i32, what: &str, otherwise: Error) -> Result<(), Error> {
    check(rc as isize, what, otherwise).map(|_| ())
}

/// The address "no particular peer" (libfabric's FI_ADDR_UNSPEC).
pub(crate) const FI_ADDR_UNSPEC: u64 = u64::MAX;

/// Sets what libfabric reads from the environment once, at its first call in
/// the process, where the user did not set it. FI_UNIVERSE_SIZE (256 by
/// default) is the number of peers ofi_rxm sizes each endpoint's CQ on the
/// core provider for (receive depth + send depth times it): 32,896 entries on
/// verbs, past rxe's 32,768, so no endpoint of "verbs;ofi_rxm" opened. An
/// endpoint of ours (a port, shared by an EVD set's connections) has a peer
/// per process it is connected to, few in a job of one process per host
/// (docs/libfabric.md, "Many connections over reliable datagrams").
pub(crate) fn prepare_libfabric() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        environ::add_defaults(&[
            ("FI_UNIVERSE_SIZE", "16"),
            // DAT's contexts must stop granting access when an LMR is freed or a
            // window unbound, and two LMRs over the same memory are two regions
            // with their own rights: libfabric's MR cache (verbs) keeps and shares
            // registrations with every right (`KeyTable::registrations_distinct`).
            ("FI_MR_CACHE_MONITOR", "disabled"),
            // ofi_rxm (1.17 to 1.22) never returns from closing a connection that
            // has a segmented message half received (its loop over the
            // connection's `deferred_sar_msgs` unlinks another list entry, so the
            // list never empties): a peer that dies mid-message, or an endpoint
            // closed then, hangs the thread in `fi_cq_read` or `fi_close` with
            // the endpoint's lock held. A SAR limit at or below the eager limit
            // sends what would be segmented (verbs: 16 to 128 KiB) by rendezvous
            // instead; on tcp ofi_rxm segments nothing anyway (dynamic receive
            // buffers). See docs/libfabric.md, "Where it stands".
            ("FI_OFI_RXM_SAR_LIMIT", "0"),
            // ofi_rxm over tcp (1.17) shares one receive context among an
            // endpoint's connections unless told not to, and fills it at
            // `fi_enable`: 68 MB touched per port, 14 connections a second at
            // one, 72 KiB a connection at 1,024. Without it a connection's
            // buffers are touched as its messages come: 1.1 MB a port, 4.8 KiB
            // a connection at 1,024 (39 KiB once every connection has carried
            // messages, against 90), 6,200 to 7,600 connections a second
            // against 4,950 (issue 37). verbs;ofi_rxm wants it off too (see
            // docs/libfabric.md).
            ("FI_OFI_RXM_USE_SRX", "0"),
        ]);
    });
}

/// The words of an ofi entry's ia_params after its provider ("ofi <provider>
/// [<where>] [dgram=<provider>]", in any order after the provider): where,
/// and the libfabric provider of its datagram EPs (`dgram`).
pub fn entry_options<'a>(
    words: impl Iterator<Item = &'a str>,
) -> (Option<&'a str>, Option<&'a str>) {
    let mut place = None;
    let mut dgram = None;
    for w in words {
        match w.strip_prefix("dgram=") {
            Some(p) => dgram = Some(p),
            None => place = place.or(Some(w)),
        }
    }
    (place, dgram)
}

/// The words of an ofi entry's ia_params after "ofi": the libfabric provider
/// ("tcp", "verbs", "tcp;ofi_rxm") and where ("lo", "eth0", an IPv4 address,
/// or a verbs device such as "rxe0" for the provider's domain name).
pub(crate) struct Target {
    pub provider: String,
    pub domain: Option<String>,
    pub address: Ipv4Addr,
}

/// Resolves "ofi <provider> [interface|address|domain]".
pub(crate) fn parse_target(provider: &str, place: Option<&str>) -> Result<Target, String> {
    let (domain, address) = match place {
        None => (None, Ipv4Addr::LOCALHOST),
        Some(p) => match p.parse::<Ipv4Addr>() {
            Ok(a) => (None, a),
            Err(_) => match interface_address(p) {
                Some(a) => (None, a),
                // Not an interface here: the provider's own domain name (verbs: rxe0);
                // its address is the interface the device sits on (else the provider's
                // source address, when it is IPv4: `Domain::open`).
                None => (
                    Some(p.to_string()),
                    rdma_device_address(p).unwrap_or(Ipv4Addr::UNSPECIFIED),
                ),
            },
        },
    };
    Ok(Target {
        provider: provider.to_string(),
        domain,
        address,
    })
}

/// The IPv4 address of interface `name`.
fn interface_address(name: &str) -> Option<Ipv4Addr> {
    daplrs_backend::netif::interface_ipv4(name).ok().flatten()
}

/// The IPv4 address of the interface RDMA device `device` (a verbs domain, "rxe0") sits on
/// (its port 1's). verbs;ofi_rxm's source address is no IPv4 address (the device's GID),
/// and peers reach our handshake at the IA address.
fn rdma_device_address(device: &str) -> Option<Ipv4Addr> {
    let (_, netdev) = daplrs_backend::netif::rdma_port_netdev(device, 1)?;
    interface_address(&netdev)
}

/// A sockaddr_in in libfabric's address fields, as a Rust address.
///
/// # Safety
/// `addr` is NULL or points to `len` readable bytes.
pub(crate) unsafe fn sockaddr_v4(
    addr: *const libc::c_void,
    len: usize,
) -> Option<std::net::SocketAddrV4> {
    if addr.is_null() || len < std::mem::size_of::<libc::sockaddr_in>() {
        return None;
    }
    // SAFETY: at least a sockaddr_in's bytes are readable (checked above).
    let sin = unsafe { std::ptr::read_unaligned(addr as *const libc::sockaddr_in) };
    if sin.sin_family as i32 != libc::AF_INET {
        return None;
    }
    Some(std::net::SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        u16::from_be(sin.sin_port),
    ))
}
