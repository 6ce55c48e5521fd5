//! The device: one libfabric fabric and domain, an event queue for connection
//! events, and the thread that moves the provider forward (libfabric 1.17's tcp
//! provider moves nothing while nobody calls it: docs/libfabric.md, Progress).

use std::collections::HashMap;
use std::ffi::CString;
use std::net::Ipv4Addr;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use daplrs_backend::{
    CmHandler, CompletionQueue, Device, DeviceAttr, Error, ProtectionDomain, QpInit, QueuePair,
    Resource, Result, SharedReceiveQueue,
};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::cm::Request;
use crate::cq::OfiCq;
use crate::mem::OfiPd;
use crate::qp::OfiQp;
use crate::{check, Fid, Info, Target};

/// What the device's objects find each other by.
#[derive(Default)]
pub(crate) struct Tables {
    pub qps: HashMap<u32, Weak<OfiQp>>,
    /// A connection's number (what its requests' contexts name) -> its QP.
    pub conns: HashMap<u32, Weak<OfiQp>>,
    /// An endpoint's `fid_ep` address -> its QP, for connection events.
    pub eps: HashMap<usize, u32>,
    pub cqs: Vec<Weak<OfiCq>>,
    /// A passive endpoint's address -> its listener.
    pub listeners: HashMap<usize, Weak<crate::cm::OfiListener>>,
    pub requests: HashMap<u64, Request>,
    /// A registration's lkey -> its descriptor (`fi_mr_desc`), for FI_MR_LOCAL providers.
    pub descs: HashMap<u32, usize>,
    /// A bound window's rkey -> the window (for a peer's send with invalidate).
    pub windows: HashMap<u32, Weak<crate::mem::OfiMw>>,
    /// RDM connection requests not yet accepted or rejected (see `rdm`).
    pub handshakes: HashMap<u64, crate::rdm::Pending>,
    /// Shared ports with eager buffers, by id (their buffers' contexts name it).
    pub ports: HashMap<u32, Weak<crate::port::Port>>,
}

pub struct OfiDevice {
    pub(crate) me: Weak<OfiDevice>,
    name: String,
    address: Ipv4Addr,
    /// The provider's description of the domain (endpoints are opened from it).
    pub(crate) info: Info,
    /// The exported key table (see `keys`; on shm read before each RDMA
    /// request: `OfiDevice::fresh_lookups`). Every provider has one: it
    /// translates addresses where the provider takes offsets, names the
    /// provider's key where it chooses keys, and carries what the initiator
    /// checks (rights, bounds, PZ), libfabric having no protection domains;
    /// so contexts are always keys of ours and memory windows always offered.
    /// Declared before the domain: fields drop in order, the domain last.
    pub(crate) keys: crate::keys::KeyTable,
    /// Reliable-datagram endpoints (FI_EP_RDM): our connection layer (`rdm`)
    /// instead of the provider's, an AV per endpoint for its peer.
    pub(crate) rdm: bool,
    /// The provider orders RDMA against sends as DAT needs (the `msg_order`
    /// asked of FI_EP_MSG); otherwise the QP keeps the order itself.
    pub(crate) ordered: bool,
    /// Endpoints are kept open while an AV entry of this process names them
    /// (providers naming endpoints by string, shm: see `rdm::Keeper`).
    pub(crate) parks: bool,
    /// The fi_info of the last connection made to an address, on providers
    /// whose answer holds nothing of one connection (`OfiDevice::connect_info`).
    pub(crate) last_connect: Mutex<Option<(std::net::SocketAddrV4, Arc<Info>)>>,
    /// Held while a CQ is read and while an endpoint opens or closes:
    /// ofi_rxm (1.17) reading a CQ progresses every endpoint bound to it, and
    /// one bound but not yet enabled has no CQ of its own yet (a NULL call,
    /// SIGSEGV). Reentrant: a QP whose last reference goes in a completion closes its
    /// endpoint on the reading thread.
    pub(crate) closing: parking_lot::ReentrantMutex<()>,
    pub(crate) eq: Fid<fi::fid_eq>,
    pub(crate) domain: Fid<fi::fid_domain>,
    pub(crate) fabric: Fid<fi::fid_fabric>,
    /// The provider addresses remote memory by virtual address (else by offset).
    pub(crate) virt_addr: bool,
    /// The provider chooses registrations' keys (FI_MR_PROV_KEY): ours, the
    /// contexts, name them through the key table's entries.
    pub(crate) prov_keys: bool,
    /// The provider wants registrations' descriptors with local buffers
    /// (FI_MR_LOCAL); otherwise posts pass none.
    pub(crate) local_descs: bool,
    /// 64-bit fetch-and-add and compare-and-swap (`atomics_offered`).
    pub(crate) atomics: bool,
    /// The core provider is verbs: an error entry's `prov_errno` is the
    /// ibv_wc_status behind its generic EIO (`cq::status_of`).
    pub(crate) verbs_errors: bool,
    /// The provider's CQ wait descriptors show what a read would find
    /// without `fi_trywait` arming them (tcp: a level-triggered epoll set of
    /// the endpoints' sockets and the CQ's signal): the connected endpoints'
    /// fid_cqs (`ready`) are then left out of the progress thread's
    /// `fi_trywait`, which walks their endpoints. Elsewhere (verbs arms its
    /// completion channel there) they are asked too.
    pub(crate) level_waits: bool,
    /// The consumer's share of a connection message: what the provider's
    /// connection data holds beside our header (`cm::with_header`).
    private_data_max: u32,
    /// A send's success waits for the peer's receipt (`rdm::Link::receipt`).
    /// ofi_rxm (1.17) sends a message up to its eager or segmentation limit
    /// (16 KiB, 128 KiB on verbs) into the peer's ofi_rxm buffers and
    /// reports it sent (FI_DELIVERY_COMPLETE asked or not) once the core
    /// provider acknowledged that: on verbs the peer's NIC does, whether or
    /// not a receive of the peer took it, its process running or not (a send
    /// to a stopped peer succeeded; so did one into a receive too small).
    /// DAT's send completes once placed in the receive. shm reports a send
    /// once the peer took it, but into an eager buffer (`eager`). A receipt is an RDMA write
    /// into the sender's receipt words (`OfiQp::send_receipt`), read with its
    /// request CQ (`OfiCq::take_receipts`).
    pub(crate) receipts: bool,
    /// Reliable datagrams: shared ports take short messages into eager
    /// buffers of their own (`eager`). DAT's send then completes once the
    /// peer's receive took it: with receipts.
    pub(crate) eager: bool,

    pub(crate) tables: Mutex<Tables>,
    /// Reliable datagrams: the endpoints QPs share (`port`).
    pub(crate) ports: Mutex<crate::port::Ports>,
    /// Reliable datagrams: the thread reading the handshakes' connections
    /// (`rdm::Handshakes`), started at the first listen or connect.
    pub(crate) handshakes: Mutex<Option<Arc<crate::rdm::Handshakes>>>,
    pub(crate) cm_handler: Mutex<Option<CmHandler>>,
    next_id: AtomicU64,
    next_qp: AtomicU32,
    next_conn: AtomicU32,
    next_port: AtomicU32,
    pub(crate) next_key: AtomicU32,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Where the progress thread sleeps (shared with it, so that it can sleep
    /// without holding the device).
    pub(crate) waiter: Arc<crate::wait::Waiter>,
    /// Connections that broke under a consumer's poll, for the progress
    /// thread to break (`OfiCq::reap_for_consumer`).
    deferred: Mutex<Vec<Arc<OfiQp>>>,
    /// QPs whose held requests the provider was too busy to take (their
    /// numbers): tried again each turn, the thread not sleeping meanwhile.
    retries: Mutex<Vec<u32>>,
    /// Ports whose eager buffers the provider was too busy to take.
    pool_retries: Mutex<Vec<Weak<crate::port::Port>>>,
    /// Some object has no wait descriptor: the progress thread then looks at
    /// everything each millisecond instead of sleeping.
    polled: AtomicBool,
}

/// The deepest DAT queue an EP may have (uDAPL benchmarks ask for 20,000).
const MAX_QUEUE_DEPTH: u32 = 1 << 16;
/// The QPs of a reliable-datagram device (they share its endpoints).
const MAX_RDM_QPS: u32 = 1 << 16;

/// The capabilities every entry needs (docs/libfabric.md, Opening an IA).
fn caps() -> u64 {
    (fi::FI_MSG | fi::FI_RMA | fi::FI_READ | fi::FI_WRITE | fi::FI_RECV | fi::FI_SEND) as u64
        | (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64
}

/// The order DAT needs of a provider: a receive for each send in order, and
/// an RDMA write visible before a later send arrives.
fn full_order() -> u64 {
    (fi::FI_ORDER_SAS | fi::FI_ORDER_RAW | fi::FI_ORDER_WAW) as u64
        | (fi::FI_ORDER_WAS | fi::FI_ORDER_SAW) as u64
}

/// What an entry may be opened as: connected endpoints, else reliable
/// datagrams with the full order, else with send-after-send order only (the
/// QP then orders the rest: `OfiDevice::ordered`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Endpoints {
    Msg,
    Rdm { ordered: bool },
}

/// The hints of an entry: its provider and domain, the endpoints asked, the
/// order DAT needs, every MR mode the backend honours; with `atomics`, FI_ATOMIC
/// too (asked only where the provider may have it: a provider without it
/// offers no entry at all for such hints).
fn hints_for(target: &Target, endpoints: Endpoints, atomics: bool) -> Info {
    // SAFETY: fi_allocinfo returns a zeroed fi_info with its attribute structs
    // (or NULL, checked); the strings given to it are strdup'ed (fi_freeinfo frees them).
    unsafe {
        let h = fi::fi_allocinfo();
        assert!(!h.is_null(), "fi_allocinfo");
        (*h).caps = caps() | if atomics { fi::FI_ATOMIC as u64 } else { 0 };
        if endpoints != Endpoints::Msg {
            // Connections share endpoints, told apart by tag (`port`).
            (*h).caps |= fi::FI_TAGGED as u64;
        }
        (*(*h).ep_attr).type_ = match endpoints {
            Endpoints::Msg => fi::fi_ep_type_FI_EP_MSG,
            Endpoints::Rdm { .. } => fi::fi_ep_type_FI_EP_RDM,
        };
        let prov = CString::new(target.provider.as_str()).unwrap_or_default();
        (*(*h).fabric_attr).prov_name = libc::strdup(prov.as_ptr());
        if let Some(d) = &target.domain {
            let d = CString::new(d.as_str()).unwrap_or_default();
            (*(*h).domain_attr).name = libc::strdup(d.as_ptr());
        }
        (*(*h).domain_attr).mr_mode =
            (fi::FI_MR_LOCAL | fi::FI_MR_VIRT_ADDR | fi::FI_MR_ALLOCATED | fi::FI_MR_PROV_KEY)
                as i32;
        (*(*h).domain_attr).threading = fi::fi_threading_FI_THREAD_SAFE;
        // Remote CQ data may consume a posted receive: ours always does (it
        // rides on sends only). Without saying so, verbs offers none (1.17:
        // `vrb_alter_info`), and a send with invalidate needs it.
        (*h).mode = fi::FI_RX_CQ_DATA;
        (*(*h).tx_attr).msg_order = match endpoints {
            Endpoints::Rdm { ordered: false } => fi::FI_ORDER_SAS as u64,
            _ => full_order(),
        };
        Info(h)
    }
}

/// fi_getinfo for `node`:`service` (`source`: they are ours, to listen on).
pub(crate) fn getinfo(
    target: &Target,
    node: Ipv4Addr,
    service: Option<u16>,
    source: bool,
) -> Result<Info, String> {
    getinfo_for(target, Some(node), service, source, Endpoints::Msg, false)
}

/// The device's fi_info: connected endpoints where the provider has them,
/// else reliable datagrams (on `address`, else wherever the provider is),
/// with atomics where the provider has them. Connected endpoints ask for
/// none: the connecting and listening sides' fi_info (`getinfo`) would have
/// to ask the same, and tcp, the provider they serve here, has none.
fn device_info(target: &Target) -> Result<(Info, Endpoints), String> {
    let msg = getinfo_for(
        target,
        Some(target.address),
        None,
        true,
        Endpoints::Msg,
        false,
    );
    let Err(why) = msg else {
        return msg.map(|i| (i, Endpoints::Msg));
    };
    for ordered in [true, false] {
        let rdm = Endpoints::Rdm { ordered };
        for node in [Some(target.address), None] {
            let with_atomics = getinfo_for(target, node, None, node.is_some(), rdm, true);
            let Ok(info) = with_atomics
                .or_else(|_| getinfo_for(target, node, None, node.is_some(), rdm, false))
            else {
                continue;
            };
            // SAFETY: the fi_info just returned.
            let named = unsafe { (*info.ptr()).addr_format } == fi::FI_ADDR_STR;
            if node.is_none() || !named {
                return Ok((info, rdm));
            }
            // A provider naming endpoints by string (shm) names them after the
            // source address given, the same in every process: none given, it
            // names them after the process.
        }
    }
    Err(why.replace(
        "offers no connected endpoint",
        "offers no connected or reliable-datagram endpoint",
    ))
}

fn getinfo_for(
    target: &Target,
    node: Option<Ipv4Addr>,
    service: Option<u16>,
    source: bool,
    endpoints: Endpoints,
    atomics: bool,
) -> Result<Info, String> {
    crate::prepare_libfabric();
    // Not installed: said, not an fi_allocinfo that gave nothing.
    fi::available()?;
    let hints = hints_for(target, endpoints, atomics);
    let node = node.map(|n| CString::new(n.to_string()).unwrap_or_default());
    let service = service.map(|p| CString::new(p.to_string()).unwrap_or_default());
    let mut info = null_mut();
    let flags = if source { fi::FI_SOURCE } else { 0 };
    // SAFETY: valid strings and hints; `info` receives a list we own.
    let rc = unsafe {
        fi::fi_getinfo(
            fi::API_VERSION,
            node.as_ref().map_or(null(), |n| n.as_ptr()),
            service.as_ref().map_or(null(), |s| s.as_ptr()),
            flags,
            hints.ptr(),
            &mut info,
        )
    };
    if rc != 0 || info.is_null() {
        return Err(format!(
            "libfabric provider '{}' offers no connected endpoint with sends, RDMA and \
             send-after-send order{}: fi_getinfo: {}",
            target.provider,
            target
                .domain
                .as_ref()
                .map_or(String::new(), |d| format!(" on domain '{d}'")),
            fi::strerror(rc)
        ));
    }
    Ok(Info(info))
}

/// Whether the domain offers what DAT's two atomics need: FI_ATOMIC in the
/// entry's capabilities, fetching FI_SUM and comparing FI_CSWAP on FI_UINT64
/// (`fi_query_atomic`, the domain-wide form of `fi_fetch_atomicvalid` and
/// `fi_compare_atomicvalid`).
fn atomics_offered(info: &Info, domain: &Fid<fi::fid_domain>) -> bool {
    // SAFETY: the fi_info the domain was opened from.
    if unsafe { (*info.ptr()).caps } & fi::FI_ATOMIC as u64 == 0 {
        return false;
    }
    let offered = |op, flags| {
        let mut attr = fi::fi_atomic_attr::default();
        // SAFETY: an open domain; `attr` receives the answer.
        let rc = unsafe {
            fi::fi_query_atomic(
                domain.ptr(),
                fi::fi_datatype_FI_UINT64,
                op,
                &mut attr,
                flags,
            )
        };
        rc == 0 && attr.count >= 1 && attr.size == 8
    };
    offered(fi::fi_op_FI_SUM, fi::FI_FETCH_ATOMIC)
        && offered(fi::fi_op_FI_CSWAP, fi::FI_COMPARE_ATOMIC)
}

impl OfiDevice {
    /// Opens "ofi <provider> [where]".
    pub fn open(provider: &str, place: Option<&str>) -> Result<Arc<OfiDevice>> {
        Self::open_described(provider, place).map_err(|e| {
            log::warn!("{}", e.why);
            // libfabric's calls fail in many ways when the process has no file
            // descriptor left (often as "no data"): that is a lack of
            // resources, not a missing provider, as DAT tells them apart.
            if e.out_of_descriptors {
                Error::NoResource(Resource::Device)
            } else {
                Error::NoDevice
            }
        })
    }

    /// Why "ofi <provider> [where]" cannot open, in words (None when it can).
    pub fn diagnose(provider: &str, place: Option<&str>) -> Option<String> {
        Self::open_described(provider, place)
            .map(|d| d.close())
            .err()
            .map(|e| e.why)
    }

    fn open_described(provider: &str, place: Option<&str>) -> Result<Arc<OfiDevice>, OpenFailure> {
        let target = crate::parse_target(provider, place)?;
        let (info, endpoints) = device_info(&target)?;
        let address = if target.address.is_unspecified() {
            // SAFETY: src_addr/src_addrlen describe the provider's source address.
            unsafe { crate::sockaddr_v4((*info.ptr()).src_addr, (*info.ptr()).src_addrlen) }
                .map_or(Ipv4Addr::UNSPECIFIED, |a| *a.ip())
        } else {
            target.address
        };
        let fail = |what: &str, rc: i32| OpenFailure::from(format!("{what}: {}", fi::strerror(rc)));
        // SAFETY: the fi_info of fi_getinfo above; each object opened is owned by a Fid.
        let (fabric, domain, eq) = unsafe {
            let mut fabric = null_mut();
            let rc = fi::fi_fabric((*info.ptr()).fabric_attr, &mut fabric, null_mut());
            if rc != 0 {
                return Err(fail("fi_fabric", rc));
            }
            let fabric = Fid(fabric);
            let mut domain = null_mut();
            let rc = fi::fi_domain(fabric.ptr(), info.ptr(), &mut domain, null_mut());
            if rc != 0 {
                return Err(fail("fi_domain", rc));
            }
            let domain = Fid(domain);
            let mut eq = null_mut();
            let mut rc = -1;
            // A descriptor to sleep on (see `wait`), else whatever the provider has.
            for wait_obj in [fi::fi_wait_obj_FI_WAIT_FD, fi::fi_wait_obj_FI_WAIT_UNSPEC] {
                let mut attr = fi::fi_eq_attr {
                    size: 256,
                    wait_obj,
                    ..Default::default()
                };
                rc = fi::fi_eq_open(fabric.ptr(), &mut attr, &mut eq, null_mut());
                if rc == 0 {
                    break;
                }
            }
            if rc != 0 {
                return Err(fail("fi_eq_open", rc));
            }
            (fabric, domain, Fid(eq))
        };
        // SAFETY: the fi_info of fi_getinfo above.
        let parks =
            endpoints != Endpoints::Msg && unsafe { (*info.ptr()).addr_format } == fi::FI_ADDR_STR;

        let waiter = crate::wait::Waiter::new().map_err(|e| format!("epoll: {e}"))?;
        let eq_fd = crate::wait::wait_fd(eq.fid());
        // SAFETY: the domain attributes of our fi_info.
        let manual = unsafe { (*(*info.ptr()).domain_attr).data_progress }
            == fi::fi_progress_FI_PROGRESS_MANUAL;
        // A provider that moves data only when called (shm: a peer's send lands
        // in our memory and wakes no descriptor) is read every millisecond.
        let polled = match eq_fd {
            _ if manual && endpoints != Endpoints::Msg => true,
            Some(fd) => waiter.watch(fd).is_err(),
            None => true,
        };
        // SAFETY: the domain attributes of our fi_info.
        let mr_mode = unsafe { (*(*info.ptr()).domain_attr).mr_mode };
        let virt_addr = mr_mode & fi::FI_MR_VIRT_ADDR as i32 != 0;
        let local_descs = mr_mode & fi::FI_MR_LOCAL as i32 != 0;
        let keys = crate::keys::KeyTable::open(domain.ptr(), !virt_addr)
            .map_err(|e| format!("key table: {e}"))?;
        if !keys.registrations_distinct(domain.ptr()) {
            return Err(String::from(
                "libfabric's MR cache gives overlapping registrations one key \
                        with every right: set FI_MR_CACHE_MONITOR=disabled",
            )
            .into());
        }
        let prov_keys = mr_mode & fi::FI_MR_PROV_KEY as i32 != 0;
        let atomics = atomics_offered(&info, &domain);
        let private_data_max = match endpoints {
            // Our own handshake carries it (`rdm`).
            Endpoints::Rdm { .. } => crate::cm::MAX_PRIVATE_DATA,
            Endpoints::Msg => {
                connection_data(&fabric, &info).map_or(crate::cm::MAX_PRIVATE_DATA, |size| {
                    let left = size.saturating_sub(crate::cm::HEADER_BYTES);
                    crate::cm::MAX_PRIVATE_DATA.min(left as u32)
                })
            }
        };
        let dev = Arc::new_cyclic(|me| OfiDevice {
            me: me.clone(),
            name: format!(
                "ofi {provider}{}",
                place.map_or(String::new(), |p| format!(" {p}"))
            ),
            address,
            info,
            eq,
            domain,
            fabric,
            virt_addr,
            prov_keys,
            local_descs,
            atomics,
            verbs_errors: provider.split(';').next() == Some("verbs"),
            level_waits: provider == "tcp",
            private_data_max,
            receipts: endpoints != Endpoints::Msg,
            // Not ofi_rxm's: its matching costs little beside its round trip
            // (1.24x at 1,024 connections without), and on verbs a receive
            // posted for a large message that came while its sender was
            // killed crashes it (1.17, inside `fi_trecvmsg`: test_peer_killed
            // in the soft-RoCE guest, two runs of three).
            eager: endpoints != Endpoints::Msg && !provider.ends_with(";ofi_rxm"),
            keys,
            rdm: endpoints != Endpoints::Msg,
            ordered: endpoints != Endpoints::Rdm { ordered: false },
            parks,
            last_connect: Mutex::new(None),
            closing: parking_lot::ReentrantMutex::new(()),
            tables: Mutex::new(Tables::default()),
            ports: Mutex::new(Default::default()),
            handshakes: Mutex::new(None),
            cm_handler: Mutex::new(None),
            next_id: AtomicU64::new(1),
            next_qp: AtomicU32::new(1),
            next_conn: AtomicU32::new(1),
            next_port: AtomicU32::new(1),
            next_key: AtomicU32::new(1),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            waiter: Arc::new(waiter),
            polled: AtomicBool::new(polled),
            deferred: Mutex::new(Vec::new()),
            retries: Mutex::new(Vec::new()),
            pool_retries: Mutex::new(Vec::new()),
        });
        dev.start_progress()
            .map_err(|e| format!("progress thread: {e}"))?;
        Ok(dev)
    }

    /// Whether RDMA addresses given to this device are offsets from the start
    /// of the target's registration (the provider's MR mode has no
    /// FI_MR_VIRT_ADDR) rather than virtual addresses.
    pub fn addresses_by_offset(&self) -> bool {
        !self.virt_addr
    }

    /// A key for a registration peers address: one whose key table slot no
    /// live key holds (`KeyTable::reserve`; a full table gives a plain
    /// counter value, which `publish` refuses).
    pub(crate) fn new_key(&self) -> u32 {
        self.keys
            .reserve(&self.next_key)
            .unwrap_or_else(|| self.next_key.fetch_add(1, Ordering::Relaxed))
    }

    /// Gives back a key from `new_key` that was never published.
    pub(crate) fn release_key(&self, key: u32) {
        self.keys.release(key);
    }

    /// Whether the initiator reads the peer's key table entry before every
    /// RDMA request rather than once per key and connection: on shm, which
    /// drops an RMA command whose key fails its check and answers nothing
    /// (libfabric 1.17, prov/shm/src/smr_progress.c): a request through a
    /// context the peer unbound, rebound or invalidated since its last use
    /// would never complete. Read fresh, the entry refuses it at the
    /// initiator (REMOTE_ACCESS, the connection broken). What is left: a
    /// peer that withdraws the key between the read and the request's
    /// arrival (a race DAT leaves undefined) still loses the request.
    pub(crate) fn fresh_lookups(&self) -> bool {
        self.name.split(' ').nth(1) == Some("shm")
    }

    /// Whether a request through a peer's key whose entry says `remote`
    /// reads the entry again next time: always on shm (`fresh_lookups`); on
    /// a provider choosing its own keys, for a window's binding: its
    /// provider key, closed at the unbind, may name a later registration of
    /// the peer's (verbs reuses a freed key's index), which a cached entry
    /// would then reach. Read fresh, the unbound context is refused.
    pub(crate) fn fresh_lookup(&self, remote: Option<&crate::keys::Remote>) -> bool {
        let window = remote.is_some_and(|r| r.rights & crate::keys::WINDOW != 0);
        self.fresh_lookups() || (self.prov_keys && window)
    }

    /// Whether the provider carries 8 bytes of remote CQ data (what a send
    /// with invalidate needs: `qp::INVALIDATE`).
    pub(crate) fn remote_data(&self) -> bool {
        // SAFETY: the domain attributes of our fi_info.
        unsafe { (*(*self.info.ptr()).domain_attr).cq_data_size >= 8 }
    }

    /// The remote CQ data of a send invalidating the peer's `rkey`
    /// (`qp::INVALIDATE`): flagged where the provider carries 8 bytes, the
    /// rkey alone where it carries 4 (verbs: no write with immediate data is
    /// offered there, the only other use); None where it carries less.
    pub(crate) fn invalidation_data(&self, rkey: u32) -> Option<u64> {
        // SAFETY: the domain attributes of our fi_info.
        let size = unsafe { (*(*self.info.ptr()).domain_attr).cq_data_size };
        match size {
            8.. => Some(crate::qp::INVALIDATE | rkey as u64),
            4.. => Some(rkey as u64),
            _ => None,
        }
    }

    /// A peer's send invalidates `rkey`: if that is a bound window of
    /// protection domain `pd`, its binding ends. Returns whether it did.
    pub(crate) fn invalidate_window(&self, rkey: u32, pd: u32) -> bool {
        let window = self
            .tables
            .lock()
            .windows
            .get(&rkey)
            .and_then(Weak::upgrade);
        window.is_some_and(|w| w.invalidate_as(rkey, pd))
    }

    /// Whether the provider has shared receive contexts (see `srq`).
    pub(crate) fn shared_rx(&self) -> bool {
        // SAFETY: the domain attributes of our fi_info.
        unsafe { (*(*self.info.ptr()).domain_attr).max_ep_srx_ctx > 0 }
    }

    /// The provider's receive and transmit queue depths.
    pub(crate) fn queue_depths(&self) -> (usize, usize) {
        // SAFETY: the attribute structs of our fi_info, read only.
        let (rx, tx) = unsafe {
            let i = &*self.info.ptr();
            ((*i.rx_attr).size, (*i.tx_attr).size)
        };
        (rx.max(1), tx.max(1))
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn next_qp_num(&self) -> u32 {
        self.next_qp.fetch_add(1, Ordering::Relaxed)
    }

    /// A new connection's number (never 0).
    pub(crate) fn next_conn(&self) -> u32 {
        loop {
            let n = self.next_conn.fetch_add(1, Ordering::Relaxed);
            if n != 0 {
                return n;
            }
        }
    }

    /// A new shared port's id (never 0, below 2^24: see `port::POOL_CONN`).
    pub(crate) fn next_port_id(&self) -> u32 {
        let t = self.tables.lock();
        loop {
            let n = self.next_port.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
            if n != 0 && !t.ports.contains_key(&n) {
                return n;
            }
        }
    }

    /// The progress thread posts `port`'s eager buffers at its next turn.
    pub(crate) fn retry_pool(&self, port: &Arc<crate::port::Port>) {
        self.pool_retries.lock().push(Arc::downgrade(port));
        self.waiter.wake();
    }

    /// An eager buffer's completion (`port::POOL_CONN`): the port, the QP of
    /// the connection its tag names, and what landed for it.
    pub(crate) fn pool_landed(
        &self,
        done: &crate::cq::Done,
    ) -> Option<(Arc<crate::port::Port>, Arc<OfiQp>, crate::eager::Landing)> {
        let token = done.context as u32;
        let (port, qp) = {
            let t = self.tables.lock();
            let conn = crate::eager::conn_of(done.tag);
            let port = t.ports.get(&(token >> 8)).and_then(Weak::upgrade)?;
            (port, t.conns.get(&conn).and_then(Weak::upgrade))
        };
        // The buffer goes back to the provider whoever it was for.
        let arrival = port.landed((token & 0xff) as usize, done)?;
        Some((port, qp?, arrival))
    }

    /// The QP of connection number `conn`, while it has it.
    pub(crate) fn conn(&self, conn: u32) -> Option<Arc<OfiQp>> {
        self.tables.lock().conns.get(&conn).and_then(Weak::upgrade)
    }

    fn start_progress(self: &Arc<Self>) -> std::io::Result<()> {
        let me = Arc::downgrade(self);
        let waiter = self.waiter.clone();
        let handle = std::thread::Builder::new()
            .name("daplrs-ofi".into())
            .spawn(move || progress_loop(me, waiter))?;
        *self.thread.lock() = Some(handle);
        Ok(())
    }

    /// Has the progress thread break these connections (see `deferred`).
    pub(crate) fn defer_broken(&self, qps: Vec<Arc<OfiQp>>) {
        self.deferred.lock().extend(qps);
        self.waiter.wake();
    }

    /// Has the progress thread post QP `qp_num`'s held requests again soon.
    pub(crate) fn retry_later(&self, qp_num: u32) {
        let mut retries = self.retries.lock();
        if !retries.contains(&qp_num) {
            retries.push(qp_num);
        }
        drop(retries);
        self.waiter.wake();
    }

    /// A new CQ's wait descriptor joins the progress thread's set; a CQ
    /// without one makes the thread poll. The thread is woken either way: the
    /// provider arms a descriptor only in `fi_trywait`, which the sleeping
    /// thread made before this CQ existed.
    fn watch_cq(&self, cq: &OfiCq) {
        if !self.rdm {
            if let Err(e) = self.waiter.watch(cq.ready.fd()) {
                log::warn!("CQ {}: ready set not watched ({e}): polled", cq.ready.fd());
                self.polled.store(true, Ordering::Release);
            }
        }
        self.watch_fd(cq.wait_fd);
    }

    /// As `watch_cq`, for a wait descriptor of another CQ (an SRQ QP's own).
    pub(crate) fn watch_fd(&self, fd: Option<std::os::fd::RawFd>) {
        let watched = fd.is_some_and(|fd| self.waiter.watch(fd).is_ok());
        if !watched {
            self.polled.store(true, Ordering::Release);
        }
        self.waiter.wake();
    }

    /// One turn of the progress thread: connection events, then every CQ read
    /// (which is what moves the provider's transfers). Returns the CQs read,
    /// for `fi_trywait` before the thread sleeps.
    /// `eq_wait_ms`: how long the EQ's read may wait (the polled tick).
    fn progress_once(&self, eq_wait_ms: i32) -> Vec<Arc<OfiCq>> {
        let deferred = std::mem::take(&mut *self.deferred.lock());
        for qp in deferred {
            qp.broken();
        }
        let pools = std::mem::take(&mut *self.pool_retries.lock());
        for port in pools.iter().filter_map(Weak::upgrade) {
            port.repost();
        }
        let retries = std::mem::take(&mut *self.retries.lock());
        for qp in retries.into_iter().filter_map(|n| self.qp(n)) {
            qp.retry_held();
        }
        // Polling at the idle pace, the EQ's timed read is the thread's tick.
        self.handle_cm_events(eq_wait_ms);
        let cqs: Vec<Arc<OfiCq>> = {
            let mut t = self.tables.lock();
            t.cqs.retain(|w| w.strong_count() > 0);
            t.cqs.iter().filter_map(Weak::upgrade).collect()
        };
        for cq in &cqs {
            cq.reap_and_notify();
        }
        cqs
    }

    pub(crate) fn qp(&self, qp_num: u32) -> Option<Arc<OfiQp>> {
        self.tables.lock().qps.get(&qp_num).and_then(Weak::upgrade)
    }

    pub(crate) fn emit(&self, event: daplrs_backend::CmEvent) {
        log::debug!("{event:?}");
        let handler = self.cm_handler.lock().clone();
        match handler {
            Some(h) => h(event),
            None => log::debug!("connection event with no handler: {event:?}"),
        }
    }

    fn attributes(&self) -> DeviceAttr {
        // SAFETY: the attribute structs of our fi_info, read only.
        let (ep, tx, rx, dom) = unsafe {
            let i = &*self.info.ptr();
            (&*i.ep_attr, &*i.tx_attr, &*i.rx_attr, &*i.domain_attr)
        };
        let clamp = |v: usize| v.min(u32::MAX as usize) as u32;
        DeviceAttr {
            // Over reliable datagrams QPs share the provider's endpoints
            // (`port`): how many is ours to say.
            max_qp: if self.rdm {
                MAX_RDM_QPS
            } else {
                clamp(dom.ep_cnt)
            },
            // Deeper than the provider's queues: the QP holds what they cannot
            // take and feeds it as they complete (`qp`).
            max_qp_wr: MAX_QUEUE_DEPTH,
            max_sge: clamp(tx.iov_limit.min(rx.iov_limit).max(1)),
            max_cq: clamp(dom.cq_cnt),
            max_cqe: 65536,
            max_mr: clamp(dom.mr_cnt.max(1 << 16)),
            // libfabric states no bound; no region exceeds a process's address
            // space (at most 2^56 bytes, x86-64 with 5-level paging), and a
            // length beyond it is the caller's error, as on the other backends.
            max_mr_size: 1 << 56,
            max_pd: 1 << 16,
            // A bind's context is announced before the bind registers
            // (`MemoryWindow::next_rkey`): a key of ours, which the key table
            // maps to the provider's.
            max_mw: 1 << 16,
            // libfabric bounds the endpoints per shared context
            // (max_ep_srx_ctx), not how many contexts a domain has; without
            // them an SRQ is a pool of ours (`srq`), bounded by memory alone.
            max_srq: 1 << 16,
            max_srq_wr: MAX_QUEUE_DEPTH,
            max_msg_size: clamp(ep.max_msg_size),
            max_rdma_size: clamp(ep.max_msg_size),
            // libfabric bounds RDMA reads in flight only by the transmit queue.
            max_rd_atomic: clamp(tx.size),
            max_private_data: self.private_data_max,
            mtu: 4096,
            ud: false,
            max_rdma_read_sge: clamp(tx.rma_iov_limit.max(1)).min(clamp(tx.iov_limit.max(1))),
            atomics: self.atomics,
            pins_for_write: false,
            pin_limit: None,
            write_imm: self.remote_data(),
            transport: "libfabric",
        }
    }
}

/// How many bytes of connection data the provider carries with a connect,
/// accept or reject (`FI_OPT_CM_DATA_SIZE`, asked of a passive endpoint;
/// libfabric's verbs provider: 55, tcp: 256). None where it does not say.
fn connection_data(fabric: &Fid<fi::fid_fabric>, info: &Info) -> Option<usize> {
    let mut pep = null_mut();
    // SAFETY: an open fabric and its provider's fi_info; `pep` receives the endpoint.
    let rc = unsafe { fi::fi_passive_ep(fabric.ptr(), info.ptr(), &mut pep, null_mut()) };
    if rc != 0 {
        log::debug!("fi_passive_ep (connection data size): {}", fi::strerror(rc));
        return None;
    }
    let pep = Fid(pep);
    let mut size = 0usize;
    let mut len = std::mem::size_of::<usize>();
    // SAFETY: the passive endpoint just opened; `size` has `len` writable bytes.
    let rc = unsafe {
        fi::fi_pep_getopt(
            pep.ptr(),
            fi::FI_OPT_ENDPOINT as i32,
            fi::FI_OPT_CM_DATA_SIZE as i32,
            (&mut size as *mut usize).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(size)
}

/// How often the progress thread turns on a provider it must poll (some
/// object without a wait descriptor: shm, ofi_rxm). Idle, once a millisecond
/// (the EQ's timed read). For `HOT` after a post, every `HOT_NAP`: a peer's
/// RDMA write or send reaches a DAT program spinning on its memory only when
/// some turn reads the provider (that program calls nothing that would), and
/// after a post the answer is due soon; then the naps double back to the
/// millisecond. Measured in docs/libfabric.md ("The polled pace").
#[derive(Default)]
struct Cadence {
    hot_until: Option<std::time::Instant>,
    nap: std::time::Duration,
}

impl Cadence {
    const HOT: std::time::Duration = std::time::Duration::from_millis(2);
    const HOT_NAP: std::time::Duration = std::time::Duration::from_micros(25);
    const IDLE: std::time::Duration = std::time::Duration::from_millis(1);

    /// The nap before the next turn, or None at the idle pace (the EQ's read
    /// waits then). `posted`: something was posted since the last turn.
    fn next(&mut self, posted: bool) -> Option<std::time::Duration> {
        self.next_at(posted, std::time::Instant::now())
    }

    fn next_at(&mut self, posted: bool, now: std::time::Instant) -> Option<std::time::Duration> {
        if posted {
            self.hot_until = Some(now + Self::HOT);
            self.nap = Self::HOT_NAP;
        }
        let until = self.hot_until?;
        if now >= until {
            self.nap *= 2;
            if self.nap >= Self::IDLE {
                self.hot_until = None;
                return None;
            }
        }
        Some(self.nap)
    }
}

/// Reads the EQ and CQs, then sleeps on their descriptors until one is ready.
/// While a consumer polls, it moves the provider itself: the thread naps
/// instead, on its eventfd alone, until one full turn every `FULL_TURN` for
/// what nobody polls (the EQ, other CQs) or until woken (a connection to
/// break, a new CQ, the stop). Naps to the next turn, not to the end of the
/// poller's window: a timer every 100 us took the pollers' CPUs (A/B in
/// docs/libfabric.md, Progress).
fn progress_loop(me: Weak<OfiDevice>, waiter: Arc<crate::wait::Waiter>) {
    const FULL_TURN: std::time::Duration = std::time::Duration::from_millis(1);
    waiter.precise_naps();
    let mut cadence = Cadence::default();
    let mut napping_since: Option<std::time::Instant> = None;
    // Woken from a nap: a connection to break, a new CQ or the stop.
    let mut woken = false;
    loop {
        let Some(dev) = me.upgrade() else { return };
        if dev.stop.load(Ordering::Acquire) {
            return;
        }
        if !woken && waiter.consumer_polling() {
            let since = *napping_since.get_or_insert_with(std::time::Instant::now);
            let left = FULL_TURN.saturating_sub(since.elapsed());
            if !left.is_zero() {
                drop(dev);
                woken = waiter.nap(left);
                continue;
            }
        }
        napping_since = None;
        woken = false;
        if dev.polled.load(Ordering::Acquire) {
            let nap = cadence.next(waiter.take_posted());
            let cqs = dev.progress_once(if nap.is_some() { 0 } else { 1 });
            if let Some(nap) = nap {
                drop((cqs, dev));
                woken = waiter.nap(nap);
            }
            continue;
        }
        let cqs = dev.progress_once(0);
        if !dev.retries.lock().is_empty() || !dev.pool_retries.lock().is_empty() {
            // A busy provider is read and tried again soon, not slept on.
            drop((cqs, dev));
            std::thread::sleep(std::time::Duration::from_micros(100));
            continue;
        }
        // A feed marked from now on wakes the thread (`Ready::mark`); one
        // marked since the turn is read first.
        waiter.going_to_sleep();
        if cqs.iter().any(|cq| cq.ready.has_marked()) {
            waiter.awake();
            continue;
        }
        let mut fids: Vec<*mut fi::fid> = Vec::with_capacity(cqs.len() + 1);
        fids.push(dev.eq.fid());
        fids.extend(cqs.iter().map(|cq| cq.cq.fid()));
        // On tcp the connected endpoints' fid_cqs are not asked (asking
        // walks their endpoints): their descriptors are in the CQs' ready
        // sets, watched; those read at every look (SRQ QPs' own) are.
        let feeds: Vec<_> = cqs
            .iter()
            .flat_map(|cq| cq.feeds(!dev.level_waits))
            .collect();
        fids.extend(feeds.iter().map(|f| f.cq.fid()));
        // Armed with the device and CQs held (their objects stay open); the
        // sleep holds neither, so that they can be dropped (a drop wakes us).
        let sleep = waiter.may_sleep(dev.fabric.ptr(), &mut fids);
        drop((feeds, cqs));
        drop(dev);
        if sleep {
            waiter.sleep();
        }
        waiter.awake();
    }
}

impl Device for OfiDevice {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn address(&self) -> Ipv4Addr {
        self.address
    }

    fn attr(&self) -> DeviceAttr {
        self.attributes()
    }

    fn alloc_pd(&self) -> Result<Arc<dyn ProtectionDomain>> {
        Ok(OfiPd::new(self))
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CompletionQueue>> {
        let cq = OfiCq::open(self, depth)?;
        self.tables.lock().cqs.push(Arc::downgrade(&cq));
        self.watch_cq(&cq);
        Ok(cq)
    }

    fn create_qp(&self, init: QpInit) -> Result<Arc<dyn QueuePair>> {
        let qp = OfiQp::new(self, init)?;
        self.tables.lock().qps.insert(qp.num(), Arc::downgrade(&qp));
        Ok(qp)
    }

    fn create_srq(
        &self,
        _pd: &Arc<dyn ProtectionDomain>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Arc<dyn SharedReceiveQueue>> {
        Ok(crate::srq::OfiSrq::open(self, max_wr, max_sge)?)
    }

    fn set_cm_handler(&self, handler: Option<CmHandler>) {
        *self.cm_handler.lock() = handler;
    }

    fn listen(&self, port: u16) -> Result<Arc<dyn daplrs_backend::Listener>> {
        if self.rdm {
            return Ok(self.listen_rdm(port)?);
        }
        Ok(self.listen_on(port)?)
    }

    fn connect(
        &self,
        qp: &Arc<dyn QueuePair>,
        remote: std::net::SocketAddrV4,
        private_data: &[u8],
        timeout: Option<std::time::Duration>,
    ) -> Result<()> {
        if self.rdm {
            return self.connect_rdm(OfiQp::of(qp)?, remote, private_data, timeout);
        }
        self.connect_qp(OfiQp::of(qp)?, remote, private_data)
    }

    fn accept(&self, req: u64, qp: &Arc<dyn QueuePair>, private_data: &[u8]) -> Result<()> {
        if self.rdm {
            return self.accept_rdm(req, OfiQp::of(qp)?, private_data);
        }
        self.accept_request(req, OfiQp::of(qp)?, private_data)
    }

    fn reject(&self, req: u64, private_data: &[u8]) -> Result<()> {
        if self.rdm {
            return self.reject_rdm(req, private_data);
        }
        self.reject_request(req, private_data)
    }

    fn disconnect(&self, qp: &Arc<dyn QueuePair>, abrupt: bool) -> Result<()> {
        OfiQp::of(qp)?.disconnect(abrupt);
        Ok(())
    }

    fn close(&self) {
        self.stop.store(true, Ordering::Release);
        self.waiter.wake();
        let thread = self.thread.lock().take();
        if let Some(t) = thread {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        let qps: Vec<Arc<OfiQp>> = self
            .tables
            .lock()
            .qps
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for qp in qps {
            qp.destroy_now();
        }
        let handshakes = self.handshakes.lock().take();
        if let Some(hs) = handshakes {
            hs.stop();
        }
    }
}

impl Drop for OfiDevice {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.waiter.wake();
        if let Some(hs) = self.handshakes.get_mut().take() {
            hs.stop();
        }
        let mut tables = self.tables.lock();
        tables.requests.clear();
        tables.handshakes.clear();
    }
}

/// Why a device did not open, and whether the process had no file descriptor
/// left then: told when the failure is made, as closing what was opened
/// before it frees descriptors again.
struct OpenFailure {
    why: String,
    out_of_descriptors: bool,
}

impl From<String> for OpenFailure {
    fn from(why: String) -> Self {
        OpenFailure {
            why,
            out_of_descriptors: out_of_descriptors(),
        }
    }
}

/// Whether the process can open no more file descriptors.
fn out_of_descriptors() -> bool {
    // SAFETY: a plain system call; the descriptor, if any, is closed at once.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: the descriptor just opened, ours.
        unsafe { libc::close(fd) };
        return false;
    }
    let errno = std::io::Error::last_os_error().raw_os_error();
    matches!(errno, Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// Checks a libfabric call made while opening an object.
pub(crate) fn opened(rc: i32, what: &str, otherwise: Error) -> Result<()> {
    check(rc as isize, what, otherwise).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::Cadence;
    use std::time::{Duration, Instant};

    #[test]
    fn the_polled_pace_quickens_after_a_post_and_slows_back_to_the_tick() {
        let mut c = Cadence::default();
        let t0 = Instant::now();
        assert_eq!(
            c.next_at(false, t0),
            None,
            "idle: the EQ's millisecond read"
        );
        assert_eq!(c.next_at(true, t0), Some(Cadence::HOT_NAP));
        let inside = t0 + Cadence::HOT - Duration::from_micros(1);
        assert_eq!(c.next_at(false, inside), Some(Cadence::HOT_NAP));
        // Past the hot window the naps double until they reach the tick.
        let after = t0 + Cadence::HOT;
        let mut naps = Vec::new();
        while let Some(nap) = c.next_at(false, after) {
            naps.push(nap);
        }
        assert_eq!(naps.first(), Some(&(Cadence::HOT_NAP * 2)));
        assert!(naps.windows(2).all(|w| w[1] == w[0] * 2));
        assert!(naps.len() < 8 && *naps.last().unwrap() < Cadence::IDLE);
        assert_eq!(c.next_at(false, after), None);
        // A post brings the quick pace back at once.
        assert_eq!(c.next_at(true, after), Some(Cadence::HOT_NAP));
    }
}
