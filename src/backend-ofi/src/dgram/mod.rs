//! Unreliable datagrams: the datagram side of an entry, named in its
//! ia_params as `dgram=<provider>` (libfabric's `udp` here; docs/libfabric.md,
//! Datagrams). The entry's own provider carries its connections; datagram
//! QPs are `FI_EP_DGRAM` endpoints of this second fabric and domain, whose
//! one address vector holds every peer endpoint a resolution named.
//!
//! A datagram carries our 8-byte header (`HEADER`: the sender's IA address,
//! for the receive's GRH area, and whether it asks for solicited
//! notification) before the consumer's payload, so a device's MTU is the
//! provider's largest message less the header (and the prefix a provider may
//! ask for: `FI_MSG_PREFIX`). The QPs are in `qp`; their address exchange
//! rides on the entry's handshake (`rdm::ud`); an address handle is `ah`.

mod ah;
mod qp;

pub(crate) use ah::OfiAh;
pub(crate) use qp::DgramQp;

use std::collections::HashMap;
use std::ffi::CString;
use std::net::Ipv4Addr;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use daplrs_backend::{Error, Resource, Result, UdPeer};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::{opened, Fid, Info};

/// Our datagram header: "DG", version 1, flags, the sender's IPv4 address.
pub(crate) const HEADER: usize = 8;
const MAGIC: [u8; 3] = [b'D', b'G', 1];
/// Header flag: the send asked for solicited notification.
const SOLICITED: u8 = 1;
/// The largest payload offered whatever the provider says (an InfiniBand MTU).
const MTU_MAX: usize = 4096;
/// Room in a fabric address name.
const NAME_BYTES: usize = 256;

/// The datagram side of a device: its fabric, domain and address vector.
pub(crate) struct Dgram {
    /// The provider's name ("udp"), which both sides of a resolution must share.
    pub(crate) provider: String,
    /// The IA's address, which the header carries as the sender's.
    pub(crate) address: Ipv4Addr,
    /// Datagrams dropped because their QP had no receive posted.
    dropped: AtomicU64,
    /// A peer endpoint's name -> its AV address, and (IA address, QP number)
    /// -> the same, for a send naming another QP than its handle's.
    names: Mutex<Names>,
    /// Declared in closing order: the AV, then the domain, the fabric.
    av: Fid<fi::fid_av>,
    pub(crate) domain: Fid<fi::fid_domain>,
    _fabric: Fid<fi::fid_fabric>,
    pub(crate) info: Info,
}

#[derive(Default)]
struct Names {
    by_name: HashMap<Vec<u8>, u64>,
    by_qp: HashMap<(Ipv4Addr, u32), u64>,
}

/// The hints for `provider`'s datagram endpoints on `address`.
fn hints(provider: &str) -> Info {
    // SAFETY: fi_allocinfo returns a zeroed fi_info with its attribute
    // structs (or NULL, checked); the strings given are strdup'ed.
    unsafe {
        let h = fi::fi_allocinfo();
        assert!(!h.is_null(), "fi_allocinfo");
        (*h).caps = (fi::FI_MSG | fi::FI_SEND | fi::FI_RECV) as u64;
        (*(*h).ep_attr).type_ = fi::fi_ep_type_FI_EP_DGRAM;
        let prov = CString::new(provider).unwrap_or_default();
        (*(*h).fabric_attr).prov_name = libc::strdup(prov.as_ptr());
        (*(*h).domain_attr).mr_mode =
            (fi::FI_MR_LOCAL | fi::FI_MR_VIRT_ADDR | fi::FI_MR_ALLOCATED | fi::FI_MR_PROV_KEY)
                as i32;
        (*(*h).domain_attr).threading = fi::fi_threading_FI_THREAD_SAFE;
        // Our buffers have room for a prefix (verbs' datagrams want one).
        (*h).mode = fi::FI_MSG_PREFIX;
        Info(h)
    }
}

impl Dgram {
    /// Opens `provider`'s datagram endpoints on `address`.
    pub(crate) fn open(provider: &str, address: Ipv4Addr) -> std::result::Result<Dgram, String> {
        let info = getinfo(provider, address)?;
        let fail =
            |what: &str, rc: i32| format!("datagrams ({provider}): {what}: {}", fi::strerror(rc));
        let (fabric, domain) =
            crate::domain::fabric_and_domain(&info).map_err(|(what, rc)| fail(what, rc))?;
        // SAFETY: the domain just opened; the AV opened is owned by a Fid.
        unsafe {
            let mut attr = fi::fi_av_attr {
                type_: fi::fi_av_type_FI_AV_TABLE,
                count: 64,
                ..Default::default()
            };
            let mut av = null_mut();
            let rc = fi::fi_av_open(domain.ptr(), &mut attr, &mut av, null_mut());
            if rc != 0 {
                return Err(fail("fi_av_open", rc));
            }
            Ok(Dgram {
                provider: provider.to_string(),
                address,
                dropped: AtomicU64::new(0),
                names: Mutex::new(Names::default()),
                av: Fid(av),
                domain,
                _fabric: fabric,
                info,
            })
        }
    }

    /// The provider's largest message, receive prefix and queue depths.
    fn ep_limits(&self) -> (usize, usize, usize, usize) {
        // SAFETY: the attribute structs of our fi_info, read only.
        unsafe {
            let i = &*self.info.ptr();
            let prefix = if ((*i.rx_attr).mode | i.mode) & fi::FI_MSG_PREFIX != 0 {
                (*i.ep_attr).msg_prefix_size
            } else {
                0
            };
            (
                (*i.ep_attr).max_msg_size,
                prefix,
                (*i.rx_attr).size.max(1),
                (*i.tx_attr).size.max(1),
            )
        }
    }

    /// The prefix a send buffer starts with: only where the provider asks it of
    /// transmits. verbs asks it of receives alone (their GRH lands there) and sends
    /// whatever the buffer holds, so a send prefix of ours reached the peer as data.
    fn tx_prefix(&self) -> usize {
        // SAFETY: the attribute structs of our fi_info, read only.
        unsafe {
            let i = &*self.info.ptr();
            if (*i.tx_attr).mode & fi::FI_MSG_PREFIX != 0 {
                (*i.ep_attr).msg_prefix_size
            } else {
                0
            }
        }
    }

    /// The largest payload of a datagram: the provider's largest message
    /// less our header (at most an InfiniBand MTU).
    pub(crate) fn mtu(&self) -> u32 {
        let (max, _, _, _) = self.ep_limits();
        max.saturating_sub(HEADER).min(MTU_MAX) as u32
    }

    /// What datinfo says of the datagram side.
    pub(crate) fn describe(&self) -> String {
        let (max, prefix, rx, tx) = self.ep_limits();
        // SAFETY: the fabric attributes of our fi_info.
        let version = unsafe { (*(*self.info.ptr()).fabric_attr).prov_version };
        format!(
            "datagrams: libfabric provider {} {}.{}, FI_EP_DGRAM, max message {max} B \
             (prefix {prefix} B), MTU {} B, transmit depth {tx}, receive depth {rx}",
            self.provider,
            version >> 16,
            version & 0xffff,
            self.mtu()
        )
    }

    /// Whether posts name a registration's descriptor (FI_MR_LOCAL).
    fn local_descs(&self) -> bool {
        // SAFETY: the domain attributes of our fi_info.
        unsafe { (*(*self.info.ptr()).domain_attr).mr_mode & fi::FI_MR_LOCAL as i32 != 0 }
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn count_drop(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Where datagrams to the endpoint named `name` (of QP `qpn` on IA
    /// `addr`) go: its AV address, inserted once per name.
    pub(crate) fn peer(&self, name: &[u8], addr: Ipv4Addr, qpn: u32) -> Result<UdPeer> {
        let fi_addr = self.insert(name)?;
        self.names.lock().by_qp.insert((addr, qpn), fi_addr);
        Ok(UdPeer {
            ah: Arc::new(OfiAh { addr, fi_addr, qpn }),
            qpn,
        })
    }

    fn insert(&self, name: &[u8]) -> Result<u64> {
        let mut names = self.names.lock();
        if let Some(&a) = names.by_name.get(name) {
            return Ok(a);
        }
        // Zero-padded: a provider reading a fixed length reads nothing beyond.
        let mut padded = [0u8; NAME_BYTES];
        padded
            .get_mut(..name.len())
            .ok_or(Error::Invalid)?
            .copy_from_slice(name);
        let mut addr = crate::FI_ADDR_UNSPEC;
        // SAFETY: an open AV; `padded` holds a name of this provider's
        // shape, `addr` receives one fi_addr_t.
        let rc = unsafe {
            fi::fi_av_insert(
                self.av.ptr(),
                padded.as_ptr().cast(),
                1,
                &mut addr,
                0,
                null_mut(),
            )
        };
        if rc != 1 {
            log::warn!("datagrams: fi_av_insert: {}", fi::strerror(rc.min(0)));
            return Err(Error::NoResource(Resource::Qp));
        }
        names.by_name.insert(name.to_vec(), addr);
        Ok(addr)
    }

    /// The AV address of QP `qpn` on IA `addr`, if a resolution named it.
    fn lookup(&self, addr: Ipv4Addr, qpn: u32) -> Option<u64> {
        self.names.lock().by_qp.get(&(addr, qpn)).copied()
    }

    pub(crate) fn av(&self) -> &Fid<fi::fid_av> {
        &self.av
    }
}

fn getinfo(provider: &str, address: Ipv4Addr) -> std::result::Result<Info, String> {
    let hints = hints(provider);
    let node = CString::new(address.to_string()).unwrap_or_default();
    let mut info = null_mut();
    // SAFETY: valid strings and hints; `info` receives a list we own.
    let rc = unsafe {
        fi::fi_getinfo(
            fi::API_VERSION,
            node.as_ptr(),
            null(),
            fi::FI_SOURCE,
            hints.ptr(),
            &mut info,
        )
    };
    if rc != 0 || info.is_null() {
        return Err(format!(
            "libfabric provider '{provider}' offers no datagram endpoint (FI_EP_DGRAM) on \
             {address}: fi_getinfo: {}",
            fi::strerror(rc)
        ));
    }
    Ok(Info(info))
}

/// Our header for a datagram from `from`.
fn header(from: Ipv4Addr, solicited: bool) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..3].copy_from_slice(&MAGIC);
    h[3] = if solicited { SOLICITED } else { 0 };
    h[4..].copy_from_slice(&from.octets());
    h
}

/// A datagram's sender and solicited flag, if it is one of ours.
fn parse_header(d: &[u8]) -> Option<(Ipv4Addr, bool)> {
    if d.len() < HEADER || d[..3] != MAGIC {
        return None;
    }
    let ip = Ipv4Addr::new(d[4], d[5], d[6], d[7]);
    Some((ip, d[3] & SOLICITED != 0))
}

/// Opens a registration of `len` bytes at `addr` for local sends and
/// receives (FI_MR_LOCAL providers).
fn register(dg: &Dgram, addr: *const u8, len: usize) -> Result<Fid<fi::fid_mr>> {
    let iov = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    let attr = fi::fi_mr_attr {
        mr_iov: (&iov as *const libc::iovec).cast(),
        iov_count: 1,
        access: (fi::FI_SEND | fi::FI_RECV) as u64,
        ..Default::default()
    };
    let mut mr = null_mut();
    // SAFETY: an open domain; the attributes point at `iov`, alive for the call.
    let rc = unsafe { fi::fi_mr_regattr(dg.domain.ptr(), &attr, 0, &mut mr) };
    opened(
        rc,
        "datagrams: fi_mr_regattr",
        Error::NoResource(Resource::Memory),
    )?;
    Ok(Fid(mr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_says_who_sent_and_whether_solicited() {
        let h = header(Ipv4Addr::new(10, 1, 2, 3), true);
        assert_eq!(parse_header(&h), Some((Ipv4Addr::new(10, 1, 2, 3), true)));
        let h = header(Ipv4Addr::LOCALHOST, false);
        assert_eq!(parse_header(&h), Some((Ipv4Addr::LOCALHOST, false)));
        assert_eq!(
            parse_header(b"DG\x02\0\x7f\0\0\x01"),
            None,
            "another version"
        );
        assert_eq!(parse_header(b"DG\x01"), None, "too short");
    }
}
