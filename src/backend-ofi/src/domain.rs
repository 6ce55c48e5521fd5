//! The domain: the libfabric fabric, domain and event queue a device opened,
//! what its provider offers, and what every object of the device needs of
//! it (the key table, numbering, the descriptors of registrations, the
//! progress thread's waiter and the work objects hand it). It knows nothing
//! of the objects above it: the progress loop (`device`) drains what they
//! leave here (`Domain::take_retries`).

use std::collections::HashMap;
use std::ffi::CString;
use std::net::Ipv4Addr;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use daplrs_backend::{CmHandler, Result};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::{Fid, Info, Target};

/// A bound memory window as the domain knows it (`mem::OfiMw`): a peer's
/// send with invalidate ends its binding (`Domain::invalidate_window`).
pub(crate) trait Window: Send + Sync {
    /// Ends the binding of `rkey` if the window is bound under it in
    /// protection domain `pd`; returns whether it did.
    fn invalidate_as(&self, rkey: u32, pd: u32) -> bool;
}

/// The opened fabric, domain and EQ of a device, and what its objects share.
pub(crate) struct Domain {
    pub(crate) me: Weak<Domain>,
    pub(crate) name: String,
    pub(crate) address: Ipv4Addr,
    /// The provider's description of the domain (endpoints are opened from it).
    pub(crate) info: Info,
    /// The exported key table (see `keys`; on shm read before each RDMA
    /// request: `Domain::fresh_lookups`). Every provider has one: it
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
    /// (providers naming endpoints by string, shm: see `port::Keeper`).
    pub(crate) parks: bool,
    /// The fi_info of the last connection made to an address, on providers
    /// whose answer holds nothing of one connection (`cm`: `connect_info`).
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
    /// An RDMA read waits for the sends before it (tcp, FI_EP_MSG): tcp stops
    /// reading a connection whose send found no receive, and reads posted
    /// behind such a send did not all complete once the receive came (the
    /// behaviour test many_large_reads_in_flight_complete_in_order, 1 run in
    /// 4 with the key's entry known, 2 in 3 with it read in place).
    pub(crate) reads_after_sends: bool,
    /// How many bytes of connection data the provider carries with a
    /// connect, accept or reject (FI_EP_MSG, where it says), of which our
    /// header takes some (`cm::with_header`); None over reliable datagrams.
    pub(crate) cm_data: Option<usize>,
    /// A send's success waits for the peer's receipt (`qp`, receipts).
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

    pub(crate) cm_handler: Mutex<Option<CmHandler>>,
    next_id: AtomicU64,
    next_qp: AtomicU32,
    next_conn: AtomicU32,
    pub(crate) next_key: AtomicU32,
    /// Where the progress thread sleeps (shared with it, so that it can sleep
    /// without holding the device).
    pub(crate) waiter: Arc<crate::wait::Waiter>,
    /// A registration's lkey -> its descriptor (`fi_mr_desc`), for FI_MR_LOCAL providers.
    pub(crate) descs: Mutex<HashMap<u32, usize>>,
    /// A bound window's rkey -> the window (for a peer's send with invalidate).
    pub(crate) windows: Mutex<HashMap<u32, Weak<dyn Window>>>,
    /// Peers' key tables mapped on this host (shm: `keymap`).
    pub(crate) peer_keys: crate::keymap::PeerKeysCache,
    /// The watch over shm's locks a killed peer left held (`left_locks`).
    pub(crate) left_locks: Arc<crate::left_locks::LeftLocks>,
    /// QPs whose held requests the provider was too busy to take (their
    /// numbers): tried again each turn of the progress thread, which does not
    /// sleep meanwhile (`Domain::retry_later`).
    retries: Mutex<Vec<u32>>,
    /// The arenas our registrations hold for peers on this host (`arenas`).
    pub(crate) arenas: crate::arenas::Arenas,
    /// Registrations may move into arenas: our table is offered to peers and
    /// DAPLRS_SAME_HOST_MAP is not `never`.
    pub(crate) shares_pages: bool,
}

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
/// QP then orders the rest: `Domain::ordered`).
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

/// An opened fabric and its domain.
pub(crate) type FabricDomain = (Fid<fi::fid_fabric>, Fid<fi::fid_domain>);

/// Opens the fabric and domain `info` describes; on failure, the call that failed and its
/// code. The entry's own provider and a `dgram=` provider open theirs alike.
pub(crate) fn fabric_and_domain(
    info: &Info,
) -> std::result::Result<FabricDomain, (&'static str, i32)> {
    // SAFETY: an fi_info of fi_getinfo; each object opened is owned by a Fid (closed on drop).
    unsafe {
        let mut fabric = null_mut();
        let rc = fi::fi_fabric((*info.ptr()).fabric_attr, &mut fabric, null_mut());
        if rc != 0 {
            return Err(("fi_fabric", rc));
        }
        let fabric = Fid(fabric);
        let mut domain = null_mut();
        let rc = fi::fi_domain(fabric.ptr(), info.ptr(), &mut domain, null_mut());
        if rc != 0 {
            return Err(("fi_domain", rc));
        }
        Ok((fabric, Fid(domain)))
    }
}

impl Domain {
    /// Opens the fabric, domain and EQ of "ofi <provider> [where]"; also
    /// whether the progress thread must poll (the provider moves data only
    /// when called, or the EQ has no descriptor to sleep on).
    pub(crate) fn open(
        provider: &str,
        place: Option<&str>,
    ) -> std::result::Result<(Arc<Domain>, bool), OpenFailure> {
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
        let (fabric, domain) = fabric_and_domain(&info).map_err(|(what, rc)| fail(what, rc))?;
        // SAFETY: the fabric just opened; the EQ opened is owned by a Fid.
        let eq = unsafe {
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
            Fid(eq)
        };
        // SAFETY: the fi_info of fi_getinfo above.
        let parks =
            endpoints != Endpoints::Msg && unsafe { (*info.ptr()).addr_format } == fi::FI_ADDR_STR;

        // SAFETY: the domain attributes of our fi_info.
        let mr_mode = unsafe { (*(*info.ptr()).domain_attr).mr_mode };
        let virt_addr = mr_mode & fi::FI_MR_VIRT_ADDR as i32 != 0;
        let local_descs = mr_mode & fi::FI_MR_LOCAL as i32 != 0;
        let keys = crate::keys::KeyTable::open(domain.ptr(), !virt_addr)
            .map_err(|e| format!("key table: {e}"))?;
        let waiter =
            crate::wait::Waiter::new(keys.poll_stamp()).map_err(|e| format!("epoll: {e}"))?;
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
        keys.set_bell(waiter.bell_fd());
        let shares_pages = keys.share().is_some() && daplrs_backend::arena::enabled();
        if !keys.registrations_distinct(domain.ptr()) {
            return Err(String::from(
                "libfabric's MR cache gives overlapping registrations one key \
                        with every right: set FI_MR_CACHE_MONITOR=disabled",
            )
            .into());
        }
        let prov_keys = mr_mode & fi::FI_MR_PROV_KEY as i32 != 0;
        let atomics = atomics_offered(&info, &domain);
        let cm_data = match endpoints {
            // Our own handshake carries the connection data (`rdm`).
            Endpoints::Rdm { .. } => None,
            Endpoints::Msg => connection_data(&fabric, &info),
        };
        let dom = Arc::new_cyclic(|me| Domain {
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
            reads_after_sends: provider == "tcp",
            cm_data,
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
            cm_handler: Mutex::new(None),
            next_id: AtomicU64::new(1),
            next_qp: AtomicU32::new(1),
            next_conn: AtomicU32::new(1),
            next_key: AtomicU32::new(1),
            waiter: Arc::new(waiter),
            descs: Mutex::new(HashMap::new()),
            windows: Mutex::new(HashMap::new()),
            peer_keys: Default::default(),
            left_locks: crate::left_locks::LeftLocks::new(provider == "shm"),
            retries: Mutex::new(Vec::new()),
            arenas: Default::default(),
            shares_pages,
        });
        Ok((dom, polled))
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

    /// Whether shm moves a read of `len` bytes in segments through its bounce
    /// buffers (1.17 picks cross-memory attach for no read, `smr_select_proto`)
    /// and so refuses every other request to that peer until it completed
    /// (`sar_status`). Each refused attempt took the peer's lock, spinning
    /// while the peer copied under it, and looked at the peer's mappings: the
    /// QP holds what follows such a read until it completed (`OfiQp::issue`).
    pub(crate) fn segmented_read(&self, len: u64) -> bool {
        /// shm's largest message kept whole (`SMR_INJECT_SIZE`).
        const SHM_INJECT_MAX: u64 = 4096;
        self.fresh_lookups() && len > SHM_INJECT_MAX
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

    /// Whether RDMA writes with immediate data are offered: the closing
    /// send's CQ data carries the data and the write's length (8 bytes), or,
    /// over reliable datagrams, the data alone with the length in its tag
    /// (4 bytes: `qp::IMM_CLOSE`).
    pub(crate) fn write_imm(&self) -> bool {
        // SAFETY: the domain attributes of our fi_info.
        let size = unsafe { (*(*self.info.ptr()).domain_attr).cq_data_size };
        size >= 8 || (self.rdm && size >= 4)
    }

    /// A peer's send invalidates `rkey`: if that is a bound window of
    /// protection domain `pd`, its binding ends. Returns whether it did.
    pub(crate) fn invalidate_window(&self, rkey: u32, pd: u32) -> bool {
        let window = self.windows.lock().get(&rkey).and_then(Weak::upgrade);
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

    /// Has the progress thread post QP `qp_num`'s held requests again soon.
    pub(crate) fn retry_later(&self, qp_num: u32) {
        let mut retries = self.retries.lock();
        if !retries.contains(&qp_num) {
            retries.push(qp_num);
        }
        drop(retries);
        self.waiter.wake();
    }

    /// The QPs `retry_later` named since the last call (the progress thread's).
    pub(crate) fn take_retries(&self) -> Vec<u32> {
        std::mem::take(&mut *self.retries.lock())
    }

    /// Whether some QP waits to be tried again.
    pub(crate) fn retries_waiting(&self) -> bool {
        !self.retries.lock().is_empty()
    }

    pub(crate) fn emit(&self, event: daplrs_backend::CmEvent) {
        log::debug!("{event:?}");
        let handler = self.cm_handler.lock().clone();
        match handler {
            Some(h) => h(event),
            None => log::debug!("connection event with no handler: {event:?}"),
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
/// Why a device did not open, and whether the process had no file descriptor
/// left then: told when the failure is made, as closing what was opened
/// before it frees descriptors again.
pub(crate) struct OpenFailure {
    pub(crate) why: String,
    pub(crate) out_of_descriptors: bool,
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
pub(crate) fn out_of_descriptors() -> bool {
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
