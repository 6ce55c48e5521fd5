//! Connections over FI_EP_MSG: passive endpoints, connect, accept, reject,
//! and the device's event queue turned into the trait's connection events.
//!
//! Every connect, accept and reject carries our header before the consumer's
//! private data: a peer that is not this backend (another program on the
//! port, another wire) is told apart, and a reject always says it came from
//! a consumer (DAT's PEER_REJECTED) rather than from nobody listening.

use std::net::SocketAddrV4;
use std::ptr::null_mut;
use std::sync::{Arc, Weak};

use daplrs_backend::{CmEvent, Error, Listener, Resource, Result};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::device::OfiDevice;
use crate::domain::{getinfo, Domain};
use crate::keymap::Share;
use crate::keys::PeerTable;
use crate::opened;
use crate::qp::OfiQp;
use crate::{sockaddr_v4, Fid, Info};

/// "DRO" and version 3; then the sender's key table: its key (32 bits) and
/// the address of its entry 0 (zero when the device needs no table), its
/// QP's farewell word's key (32 bits) and address (see `farewell`), and its
/// QP's protection domain (`keys::Remote`), little-endian: 32 bytes, so that
/// a consumer's private data still fits beside it in libfabric's verbs
/// provider's 55 bytes of connection data (48, version 2's, left it 7).
const MAGIC: [u8; 4] = [b'D', b'R', b'O', 3];
pub(crate) const HEADER_BYTES: usize = 32;
/// Version 4: version 3's header, then where a peer on this host maps our key
/// table (`keymap::Share`, 16 bytes), where the connection data has room for
/// it beside the consumer's (`shares_in_header`; not verbs' 55).
const MAGIC_SHARED: [u8; 4] = [b'D', b'R', b'O', 4];
pub(crate) const SHARED_HEADER_BYTES: usize = HEADER_BYTES + 16;

/// The consumer's share of a connection message where the provider bounds
/// none below it (see `OfiDevice::private_data_max`).
pub(crate) const MAX_PRIVATE_DATA: u32 = 192;

/// Whether our header offers a peer on this host our key table (`keymap`):
/// where the connection data leaves the consumer its whole share beside it
/// (our own handshake over reliable datagrams; tcp, not verbs' 55 bytes).
pub(crate) fn shares_in_header(dom: &Domain) -> bool {
    dom.cm_data
        .is_none_or(|n| n >= SHARED_HEADER_BYTES + MAX_PRIVATE_DATA as usize)
}

/// The bytes our header takes of `dom`'s connection data.
pub(crate) fn header_bytes(dom: &Domain) -> usize {
    if shares_in_header(dom) {
        SHARED_HEADER_BYTES
    } else {
        HEADER_BYTES
    }
}

/// Marks close-on-exec the listening socket bound to `addr`. libfabric's tcp
/// provider (1.17) makes its sockets without SOCK_CLOEXEC, so a child the
/// program starts (system(3), posix_spawn) held the listener: one that
/// outlived the program (dead, or exited without `dat_psp_free`, which shuts
/// the listener down everywhere) kept its port listening, and the program
/// started again had `dat_psp_create` refused with DAT_CONN_QUAL_IN_USE (a
/// TIME_WAIT does not: the provider sets SO_REUSEADDR). The socket is found
/// by what it is, a listener on that address, among our descriptors: only
/// the provider's can be one. (Its connection sockets are inherited too; a
/// child that outlives us keeps such a connection open until it exits.)
fn listener_close_on_exec(addr: &libc::sockaddr_in) {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if !listens_on(fd, addr) {
            continue;
        }
        log::debug!("listener {fd}: close-on-exec");
        // SAFETY: fcntl(2) on a descriptor of ours, setting a flag only.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags >= 0 {
            // SAFETY: as above.
            unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
        }
    }
}

/// Whether descriptor `fd` is a socket listening on `addr`.
fn listens_on(fd: std::os::fd::RawFd, addr: &libc::sockaddr_in) -> bool {
    let mut on: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into a c_int of ours, its length given; a descriptor
    // that is no socket fails (ENOTSOCK).
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut on as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 || on == 0 {
        return false;
    }
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut name: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: getsockname into a sockaddr_in of ours, its length given.
    let rc =
        unsafe { libc::getsockname(fd, (&mut name as *mut libc::sockaddr_in).cast(), &mut len) };
    rc == 0
        && i32::from(name.sin_family) == libc::AF_INET
        && name.sin_port == addr.sin_port
        && name.sin_addr.s_addr == addr.sin_addr.s_addr
}

/// A registration key as the header carries it. Keys wider than 32 bits are
/// not supported (docs/libfabric.md, Later): such a key goes as 0, "none".
fn narrow_key(key: u64, what: &str) -> u32 {
    u32::try_from(key).unwrap_or_else(|_| {
        log::warn!("{what} key {key:#x} is wider than 32 bits: not announced");
        0
    })
}

/// Our header (`qp`: the connection's QP, None for a reject) and `private_data`.
pub(crate) fn with_header(dev: &Domain, qp: Option<&OfiQp>, private_data: &[u8]) -> Vec<u8> {
    let (key, address) = (dev.keys.key, dev.keys.address);
    let (fw_key, fw_address) = qp.map_or((0, 0), |q| q.farewell.announce(dev));
    let pd = qp.map_or(0, |q| q.pd());
    let share = dev.keys.share().filter(|_| shares_in_header(dev));
    let mut v = if share.is_some() {
        MAGIC_SHARED.to_vec()
    } else {
        MAGIC.to_vec()
    };
    v.extend_from_slice(&narrow_key(key, "key table").to_le_bytes());
    v.extend_from_slice(&address.to_le_bytes());
    v.extend_from_slice(&narrow_key(fw_key, "farewell").to_le_bytes());
    v.extend_from_slice(&fw_address.to_le_bytes());
    v.extend_from_slice(&pd.to_le_bytes());
    debug_assert_eq!(v.len(), HEADER_BYTES);
    v.extend_from_slice(&Share::encode(share));
    v.extend_from_slice(private_data);
    v
}

/// The peer's table and the consumer's private data of a message of ours
/// (None: not from this backend).
pub(crate) fn strip_header(data: &[u8]) -> Option<(PeerTable, Vec<u8>)> {
    let bytes = match data.get(..4)? {
        m if m == MAGIC => HEADER_BYTES,
        m if m == MAGIC_SHARED => SHARED_HEADER_BYTES,
        _ => return None,
    };
    if data.len() < bytes {
        return None;
    }
    let word = |i: usize| u32::from_le_bytes(data[i..i + 4].try_into().expect("4 bytes"));
    let dword = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().expect("8 bytes"));
    let table = PeerTable {
        key: word(4) as u64,
        address: dword(8),
        farewell_key: word(16) as u64,
        farewell_address: dword(20),
        pd: word(28),
        share: Share::decode(&data[HEADER_BYTES..bytes]),
    };
    Some((table, data[bytes..].to_vec()))
}

pub(crate) struct OfiListener {
    id: u64,
    port: u16,
    dev: Weak<OfiDevice>,
    pep: Mutex<Option<Fid<fi::fid_pep>>>,
}

impl Listener for OfiListener {
    fn id(&self) -> u64 {
        self.id
    }

    fn port(&self) -> u16 {
        self.port
    }

    fn close(&self) {
        let pep = self.pep.lock().take();
        if let (Some(pep), Some(dev)) = (pep, self.dev.upgrade()) {
            dev.tables.lock().listeners.remove(&(pep.ptr() as usize));
        }
    }
}

/// A connection request not yet accepted or rejected.
pub(crate) struct Request {
    info: Info,
    peer: PeerTable,
    listener: Arc<OfiListener>,
    local: Option<SocketAddrV4>,
    remote: Option<SocketAddrV4>,
}

impl OfiDevice {
    pub(crate) fn target(&self) -> crate::Target {
        // SAFETY: the provider and domain names of our fi_info are NUL-terminated strings.
        let (provider, domain) = unsafe {
            let i = &*self.dom.info.ptr();
            let p = std::ffi::CStr::from_ptr((*i.fabric_attr).prov_name)
                .to_string_lossy()
                .into_owned();
            let d = std::ffi::CStr::from_ptr((*i.domain_attr).name)
                .to_string_lossy()
                .into_owned();
            (p, d)
        };
        crate::Target {
            provider,
            domain: Some(domain),
            address: daplrs_backend::Device::address(self),
        }
    }

    pub(crate) fn listen_on(&self, port: u16) -> Result<Arc<OfiListener>> {
        let target = self.target();
        let info = getinfo(&target, target.address, Some(port), true).map_err(|why| {
            log::warn!("listen on port {port}: {why}");
            // libfabric's verbs provider binds the address inside fi_getinfo
            // (rdma_cm) and reports a port in use as no data: the same
            // address with any port answering says that the port was it.
            if port != 0 && getinfo(&target, target.address, None, true).is_ok() {
                Error::AddrInUse
            } else {
                Error::NoResource(Resource::Host)
            }
        })?;
        let mut pep = null_mut();
        // SAFETY: an open fabric and a provider fi_info; `pep` receives the endpoint.
        let rc =
            unsafe { fi::fi_passive_ep(self.dom.fabric.ptr(), info.ptr(), &mut pep, null_mut()) };
        opened(rc, "fi_passive_ep", Error::NoResource(Resource::Host))?;
        let pep = Fid(pep);
        let mut name = libc::sockaddr_in {
            sin_family: 0,
            sin_port: 0,
            sin_addr: libc::in_addr { s_addr: 0 },
            sin_zero: [0; 8],
        };
        let mut len = std::mem::size_of::<libc::sockaddr_in>();
        // SAFETY: the passive endpoint just opened, the device's EQ; `name` has `len` bytes.
        unsafe {
            opened(
                fi::fi_pep_bind(pep.ptr(), self.dom.eq.fid(), 0),
                "bind EQ",
                Error::Internal,
            )?;
            opened(fi::fi_listen(pep.ptr()), "fi_listen", Error::AddrInUse)?;
            opened(
                fi::fi_pep_getname(
                    pep.ptr(),
                    (&mut name as *mut libc::sockaddr_in).cast(),
                    &mut len,
                ),
                "fi_getname",
                Error::Internal,
            )?;
        }
        listener_close_on_exec(&name);
        let listener = Arc::new(OfiListener {
            id: self.dom.next_id(),
            port: u16::from_be(name.sin_port),
            dev: self.me.clone(),
            pep: Mutex::new(Some(pep)),
        });
        let key = listener.pep.lock().as_ref().map_or(0, |p| p.ptr() as usize);
        self.tables
            .lock()
            .listeners
            .insert(key, Arc::downgrade(&listener));
        Ok(listener)
    }

    pub(crate) fn connect_qp(
        &self,
        qp: Arc<OfiQp>,
        remote: SocketAddrV4,
        private_data: &[u8],
    ) -> Result<()> {
        let info = self.connect_info(remote).map_err(|why| {
            log::warn!("connect: {why}");
            crate::out_of_descriptors_said(Error::NoDevice)
        })?;
        qp.open_endpoint(&self.dom, &info, false)?;
        qp.set_addresses(None, Some(remote));
        let data = with_header(&self.dom, Some(&qp), private_data);
        let ep = qp.endpoint().ok_or(Error::BadState)?;
        // SAFETY: the QP's enabled endpoint; the provider's destination address; `data` lives for the call.
        let rc = unsafe {
            fi::fi_connect(
                ep,
                (*info.ptr()).dest_addr,
                data.as_ptr().cast(),
                data.len(),
            )
        };
        let connected = opened(rc, "fi_connect", Error::NoResource(Resource::Qp));
        if connected.is_err() {
            // Nothing was sent: the EP stays as it was, to be connected again.
            qp.abandon();
        }
        connected
    }

    /// The fi_info to connect an endpoint to `remote`. On tcp it names the
    /// domain and the destination, nothing of one connection (fi_endpoint
    /// copies it; fi_connect is given the address), so the last one is kept
    /// for the next connection to the same address: each fi_getinfo walks the
    /// host's interfaces (a netlink dump, an ethtool ioctl per interface,
    /// five sockets), which was half of what a connection cost us beyond
    /// libfabric's own. Other providers may bind in fi_getinfo (verbs: an
    /// rdma_cm id), so they ask each time.
    fn connect_info(&self, remote: SocketAddrV4) -> std::result::Result<Arc<Info>, String> {
        let target = self.target();
        let reusable = target.provider == "tcp";
        if reusable {
            if let Some((to, info)) = self.dom.last_connect.lock().as_ref() {
                if *to == remote {
                    return Ok(info.clone());
                }
            }
        }
        let info = Arc::new(getinfo(&target, *remote.ip(), Some(remote.port()), false)?);
        if reusable {
            *self.dom.last_connect.lock() = Some((remote, info.clone()));
        }
        Ok(info)
    }

    pub(crate) fn accept_request(
        &self,
        req: u64,
        qp: Arc<OfiQp>,
        private_data: &[u8],
    ) -> Result<()> {
        let request = self
            .tables
            .lock()
            .requests
            .remove(&req)
            .ok_or(Error::BadState)?;
        qp.open_endpoint(&self.dom, &request.info, true)?;
        qp.set_addresses(request.local, request.remote);
        qp.set_peer_table(request.peer, self.dom.peer_keys.get(request.peer.share));
        let data = with_header(&self.dom, Some(&qp), private_data);
        let ep = qp.endpoint().ok_or(Error::BadState)?;
        // SAFETY: the QP's enabled endpoint, opened from the request; `data` lives for the call.
        let rc = unsafe { fi::fi_accept(ep, data.as_ptr().cast(), data.len()) };
        let accepted = opened(rc, "fi_accept", Error::BadState);
        if accepted.is_err() {
            qp.abandon();
        }
        accepted
    }

    pub(crate) fn reject_request(&self, req: u64, private_data: &[u8]) -> Result<()> {
        let request = self
            .tables
            .lock()
            .requests
            .remove(&req)
            .ok_or(Error::BadState)?;
        let pep = request
            .listener
            .pep
            .lock()
            .as_ref()
            .map(Fid::ptr)
            .ok_or(Error::BadState)?;
        let data = with_header(&self.dom, None, private_data);
        // SAFETY: the listener's open passive endpoint and the request's handle.
        let rc = unsafe {
            fi::fi_reject(
                pep,
                (*request.info.ptr()).handle,
                data.as_ptr().cast(),
                data.len(),
            )
        };
        opened(rc, "fi_reject", Error::BadState)
    }

    /// Reads the event queue: waits up to `wait_ms` for the first event.
    pub(crate) fn handle_cm_events(&self, wait_ms: i32) {
        let mut buf = vec![0u64; 128];
        let bytes = buf.len() * 8;
        let mut first = true;
        loop {
            let mut event = 0u32;
            // SAFETY: an open EQ; `buf` has `bytes` writable bytes, 8-aligned.
            let n = unsafe {
                if first {
                    fi::fi_eq_sread(
                        self.dom.eq.ptr(),
                        &mut event,
                        buf.as_mut_ptr().cast(),
                        bytes,
                        wait_ms,
                        0,
                    )
                } else {
                    fi::fi_eq_read(
                        self.dom.eq.ptr(),
                        &mut event,
                        buf.as_mut_ptr().cast(),
                        bytes,
                        0,
                    )
                }
            };
            first = false;
            if n == -(fi::FI_EAVAIL as isize) {
                self.cm_error();
                continue;
            }
            if n < std::mem::size_of::<fi::fi_eq_cm_entry>() as isize {
                return;
            }
            // SAFETY: the provider wrote an fi_eq_cm_entry followed by its data.
            let entry = unsafe { std::ptr::read(buf.as_ptr().cast::<fi::fi_eq_cm_entry>()) };
            let head = std::mem::size_of::<fi::fi_eq_cm_entry>();
            // SAFETY: `n` bytes were written into `buf`.
            let data = unsafe {
                std::slice::from_raw_parts(buf.as_ptr().cast::<u8>().add(head), n as usize - head)
            };
            self.cm_event(event, entry, data);
        }
    }

    fn cm_event(&self, event: u32, entry: fi::fi_eq_cm_entry, data: &[u8]) {
        match event {
            fi::FI_CONNREQ => self.connection_request(entry, data),
            fi::FI_CONNECTED => {
                if let Some(qp) = self.qp_of(entry.fid) {
                    if qp.on_connected() {
                        // The active side learns the passive side's table here (the
                        // passive side's event carries no header: it learnt the
                        // active side's from the request).
                        let private_data = match strip_header(data) {
                            Some((peer, data)) => {
                                qp.set_peer_table(peer, self.dom.peer_keys.get(peer.share));
                                data
                            }
                            None => Vec::new(),
                        };
                        self.emit(CmEvent::Established {
                            qp_num: qp.num(),
                            private_data,
                        });
                    }
                }
            }
            fi::FI_SHUTDOWN => {
                if let Some(qp) = self.qp_of(entry.fid) {
                    // A request that failed before the connection closed makes
                    // this a broken connection, not a disconnection: read the
                    // QP's completions first (`OfiQp::broken` ends it then).
                    qp.reap_completions();
                    // Without the peer's farewell the connection broke (see
                    // `farewell`): the peer went, or a provider dropped it.
                    let graceful = qp.ended_gracefully();
                    if qp.end_of(entry.fid) {
                        let qp_num = qp.num();
                        self.emit(if graceful {
                            CmEvent::Disconnected { qp_num }
                        } else {
                            CmEvent::Broken { qp_num }
                        });
                    }
                }
            }
            other => log::debug!("event {other} on the EQ"),
        }
    }

    fn connection_request(&self, entry: fi::fi_eq_cm_entry, data: &[u8]) {
        let info = Info(entry.info);
        let listener = self
            .tables
            .lock()
            .listeners
            .get(&(entry.fid as usize))
            .and_then(Weak::upgrade);
        let Some(listener) = listener else { return };
        let Some((peer, private_data)) = strip_header(data) else {
            // Not this backend's peer: refused at once, the consumer never sees it.
            // SAFETY: the listener's open passive endpoint and the request's handle.
            unsafe {
                if let Some(pep) = listener.pep.lock().as_ref() {
                    fi::fi_reject(pep.ptr(), (*info.ptr()).handle, std::ptr::null(), 0);
                }
            }
            return;
        };
        // SAFETY: the request's addresses, as the provider filled them.
        let (local, remote) = unsafe {
            let i = &*info.ptr();
            (
                sockaddr_v4(i.src_addr, i.src_addrlen),
                sockaddr_v4(i.dest_addr, i.dest_addrlen),
            )
        };
        let req = self.dom.next_id();
        let unspecified = SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0);
        self.tables.lock().requests.insert(
            req,
            Request {
                info,
                peer,
                listener: listener.clone(),
                local,
                remote,
            },
        );
        self.emit(CmEvent::ConnectRequest {
            listener: listener.id,
            req,
            private_data,
            remote: remote.unwrap_or(unspecified),
            local: local.unwrap_or(unspecified),
        });
    }

    fn cm_error(&self) {
        let mut err = fi::fi_eq_err_entry::default();
        // SAFETY: an open EQ with an error entry available.
        if unsafe { fi::fi_eq_readerr(self.dom.eq.ptr(), &mut err, 0) } < 0 {
            return;
        }
        let Some(qp) = self.qp_of(err.fid) else {
            return;
        };
        let connecting = qp.was_connecting();
        let peer_data = if err.err_data.is_null() || err.err_data_size == 0 {
            None
        } else {
            // SAFETY: the provider's error data, err_data_size bytes.
            strip_header(unsafe {
                std::slice::from_raw_parts(err.err_data.cast::<u8>(), err.err_data_size)
            })
            .map(|(_, data)| data)
        };
        let qp_num = qp.num();
        if !qp.end_of(err.fid) {
            return;
        }
        let event = match (connecting, err.err.unsigned_abs()) {
            (false, _) => CmEvent::Broken { qp_num },
            (true, fi::FI_ECONNREFUSED) => match peer_data {
                Some(private_data) => CmEvent::Rejected {
                    qp_num,
                    private_data,
                    by_peer: true,
                },
                None => CmEvent::rejected_not_by_peer(qp_num),
            },
            (true, fi::FI_ETIMEDOUT) => CmEvent::TimedOut { qp_num },
            (true, fi::FI_EHOSTUNREACH | fi::FI_ENETUNREACH) => CmEvent::Unreachable { qp_num },
            (true, _) => CmEvent::rejected_not_by_peer(qp_num),
        };
        self.emit(event);
    }

    fn qp_of(&self, fid: *mut fi::fid) -> Option<Arc<OfiQp>> {
        self.registry.qp_of(fid)
    }
}
