//! PSP, RSP and CSP: service points. The connection qualifier is the TCP port the backend listens
//! on. A PSP turns every connection request into a CR; an RSP serves one request on its reserved
//! EP; a CSP (DAT 2.0's Common Service Point) is a PSP named by a socket address instead of a
//! conn_qual.
//!
//! CSP rules (dat_csp_create / dat_csp_query / dat_csp_free, and dat_ep_common_connect on the
//! active side, see `Ep::common_connect`):
//! - The communicator (DAT_COMM: domain, type, protocol, as for socket(2)) must name what every
//!   IA of ours carries, reliable connected IPv4 streams: domain AF_INET, type SOCK_STREAM,
//!   protocol 0 or IPPROTO_TCP. Anything else is DAT_COMM_NOT_SUPPORTED. (The verbs backend
//!   serves the same communicator: rdma_cm's TCP port space, addressed by IPv4 address + port.)
//! - The address must be this IA's own IPv4 address (else DAT_INVALID_ADDRESS with subtype
//!   DAT_INVALID_ADDRESS_UNREACHABLE: this IA cannot listen there); its port is where the CSP
//!   listens, taken as it is (no conn_qual folding). Port 0 asks for a free port, which
//!   dat_csp_query then reports in the address. A port already listened on is
//!   DAT_CONN_QUAL_IN_USE.
//! - Requests become CRs on the CSP's CR EVD exactly as for a PSP created with
//!   DAT_PSP_CONSUMER_FLAG: DAT_CONNECTION_REQUEST_EVENT with the CSP as sp_handle and the port
//!   as conn_qual; accepted, rejected or handed off through the CR.
//! - dat_csp_free stops listening at once (later requests are refused: the requester sees
//!   DAT_CONNECTION_EVENT_NON_PEER_REJECTED); requests already delivered stay valid CRs, to be
//!   accepted or rejected, as for a PSP.

use std::net::SocketAddrV4;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::consts::{evd_flags, event_number, ib_ext, psp_flags};
use super::cr::Cr;
pub use super::ep::port_of_conn_qual;
use super::ep::Ep;
use super::error::{DatError, DatResult, ErrorType, Param, SubType};
use super::evd::{Evd, Event, EventData};
use super::handle_table::{AnyObject, Handle, HandleKind};
use super::ia::Ia;
use daplrs_backend::{CmEvent, ConnRequestId, Listener};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpKind {
    Psp,
    Rsp,
    Csp,
}

impl SpKind {
    fn handle_kind(self) -> HandleKind {
        match self {
            SpKind::Psp => HandleKind::Psp,
            SpKind::Rsp => HandleKind::Rsp,
            SpKind::Csp => HandleKind::Csp,
        }
    }
}

/// DAT_COMM: the communicator a CSP serves, as socket(2)'s (domain, type, protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Comm {
    pub domain: i32,
    pub kind: i32,
    pub protocol: i32,
}

impl Comm {
    /// Whether an IA of ours serves this communicator: reliable connected IPv4 streams.
    fn is_supported(&self) -> bool {
        self.domain == libc::AF_INET
            && self.kind == libc::SOCK_STREAM
            && (self.protocol == 0 || self.protocol == libc::IPPROTO_TCP)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpParam {
    pub ia: Handle,
    pub conn_qual: u64,
    pub evd: Handle,
    /// PSP: DAT_PSP_FLAGS. RSP: 0.
    pub flags: u32,
    /// RSP: the reserved EP.
    pub ep: Handle,
    /// CSP: its communicator.
    pub comm: Option<Comm>,
    /// The IA's address and the port the service point listens on.
    pub address: SocketAddrV4,
}

pub struct Sp {
    handle: Handle,
    kind: SpKind,
    ia: Arc<Ia>,
    evd: Arc<Evd>,
    flags: u32,
    listener: Arc<dyn Listener>,
    /// The conn_qual as the consumer gave it (the picked port for
    /// dat_psp_create_any); the listener's port may be its folded form.
    conn_qual: u64,
    ep: Option<Arc<Ep>>,
    /// CSP: its communicator.
    comm: Option<Comm>,
    freed: Mutex<bool>,
}

/// Where a new service point listens: on a conn_qual's port, on a port the backend picks, or
/// (CSP) on the port of its address with its communicator.
enum Listen {
    ConnQual(u64),
    AnyPort,
    Csp(u16, Comm),
}

impl Sp {
    fn create(
        ia: &Arc<Ia>,
        kind: SpKind,
        listen: Listen,
        evd: &Arc<Evd>,
        flags: u32,
        ep: Option<Arc<Ep>>,
    ) -> DatResult<Arc<Sp>> {
        ia.check_open()?;
        if evd.flags() & evd_flags::CR == 0 || !Arc::ptr_eq(evd.ia(), ia) {
            return Err(DatError::invalid_handle(SubType::InvalidHandleEvdCr));
        }
        let (port, conn_qual, comm) = match listen {
            Listen::ConnQual(q) => (
                port_of_conn_qual(q).ok_or(DatError::bad(Param::ConnQual))?,
                Some(q),
                None,
            ),
            Listen::AnyPort => (0, None, None),
            Listen::Csp(port, comm) => (port, None, Some(comm)),
        };
        if !evd.users.acquire() {
            return Err(DatError::invalid_handle(SubType::InvalidHandleEvdCr));
        }
        let listener = match ia.device().listen(port) {
            Ok(l) => l,
            Err(e) => {
                evd.users.release();
                return Err(e.into());
            }
        };
        let reservation = ia.reserve(kind.handle_kind());
        if let Some(ep) = &ep {
            if let Err(e) = ep.reserve_for(reservation.handle()) {
                listener.close();
                ia.unregister_listener(listener.id());
                evd.users.release();
                return Err(e);
            }
        }
        let sp = Arc::new(Sp {
            handle: reservation.handle(),
            kind,
            ia: ia.clone(),
            evd: evd.clone(),
            flags,
            conn_qual: conn_qual.unwrap_or_else(|| u64::from(listener.port())),
            listener,
            ep,
            comm,
            freed: Mutex::new(false),
        });
        ia.commit(reservation, &sp);
        // Only now do the listener's requests reach the SP (those that came already waited).
        let early = ia.register_listener(sp.listener.id(), Arc::downgrade(&sp) as Weak<AnyObject>);
        for ev in early {
            sp.on_request(ev);
        }
        Ok(sp)
    }

    /// dat_psp_create. A conn_qual already in use gives DAT_CONN_QUAL_IN_USE.
    pub fn create_psp(
        ia: &Arc<Ia>,
        conn_qual: u64,
        evd: &Arc<Evd>,
        flags: u32,
    ) -> DatResult<Arc<Sp>> {
        if flags > psp_flags::PROVIDER {
            return Err(DatError::bad(Param::PspFlags));
        }
        Sp::create(
            ia,
            SpKind::Psp,
            Listen::ConnQual(conn_qual),
            evd,
            flags,
            None,
        )
    }

    /// dat_psp_create_any: the backend picks a free port; returns it as the conn_qual.
    pub fn create_psp_any(ia: &Arc<Ia>, evd: &Arc<Evd>, flags: u32) -> DatResult<(Arc<Sp>, u64)> {
        if flags > psp_flags::PROVIDER {
            return Err(DatError::bad(Param::PspFlags));
        }
        let sp = Sp::create(ia, SpKind::Psp, Listen::AnyPort, evd, flags, None)?;
        let q = sp.conn_qual();
        Ok((sp, q))
    }

    /// dat_rsp_create: reserves `ep` (which must be UNCONNECTED) for one request on `conn_qual`.
    pub fn create_rsp(
        ia: &Arc<Ia>,
        conn_qual: u64,
        ep: &Arc<Ep>,
        evd: &Arc<Evd>,
    ) -> DatResult<Arc<Sp>> {
        Sp::create(
            ia,
            SpKind::Rsp,
            Listen::ConnQual(conn_qual),
            evd,
            0,
            Some(ep.clone()),
        )
    }

    /// dat_csp_create: listens on `address`, which must be this IA's address (its port 0 picks
    /// a free port), for the communicator `comm` (see the module's CSP rules).
    pub fn create_csp(
        ia: &Arc<Ia>,
        comm: Comm,
        address: SocketAddrV4,
        evd: &Arc<Evd>,
    ) -> DatResult<Arc<Sp>> {
        ia.check_open()?;
        if !comm.is_supported() {
            return Err(DatError::plain(ErrorType::CommNotSupported));
        }
        if *address.ip() != ia.address() {
            return Err(DatError::new(
                ErrorType::InvalidAddress,
                SubType::InvalidAddressUnreachable,
            ));
        }
        Sp::create(
            ia,
            SpKind::Csp,
            Listen::Csp(address.port(), comm),
            evd,
            0,
            None,
        )
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }
    pub fn kind(&self) -> SpKind {
        self.kind
    }
    pub fn conn_qual(&self) -> u64 {
        self.conn_qual
    }
    /// The TCP port this service point listens on.
    pub fn port(&self) -> u16 {
        self.listener.port()
    }
    pub fn ia(&self) -> &Arc<Ia> {
        &self.ia
    }

    pub fn query(&self) -> SpParam {
        SpParam {
            ia: self.ia.handle(),
            conn_qual: self.conn_qual(),
            evd: self.evd.handle(),
            flags: self.flags,
            ep: self.ep.as_ref().map(|e| e.handle()).unwrap_or(Handle::NULL),
            comm: self.comm,
            address: SocketAddrV4::new(self.ia.address(), self.port()),
        }
    }

    /// A request of its listener (`CmEvent::ConnectRequest` or `UdRequest`) arrived: see
    /// `on_connect_request`.
    pub(crate) fn on_request(self: &Arc<Self>, ev: CmEvent) {
        let ud = matches!(ev, CmEvent::UdRequest { .. });
        if let CmEvent::ConnectRequest {
            req,
            private_data,
            remote,
            local,
            ..
        }
        | CmEvent::UdRequest {
            req,
            private_data,
            remote,
            local,
            ..
        } = ev
        {
            self.on_connect_request(req, private_data, remote, local, ud);
        }
    }

    /// A connection request arrived (called from the CM event path); `ud`: a datagram EP's
    /// address-resolution request (see `ep::ud`), which becomes a CR reported as
    /// DAT_IB_UD_CONNECTION_REQUEST_EVENT and is served by PSPs without
    /// DAT_PSP_PROVIDER_FLAG and CSPs only (refused on an RSP or a provider PSP, whose EPs
    /// are connection EPs).
    pub(crate) fn on_connect_request(
        self: &Arc<Self>,
        req: ConnRequestId,
        private_data: Vec<u8>,
        remote: SocketAddrV4,
        local: SocketAddrV4,
        ud: bool,
    ) {
        if *self.freed.lock()
            || (ud && (self.ep.is_some() || self.flags & psp_flags::PROVIDER != 0))
        {
            let _ = self.ia.device().reject(req, &[]);
            return;
        }
        if let Some(ep) = &self.ep {
            // An RSP serves one request at a time, on its reserved EP.
            if !ep.make_tentative(&private_data) {
                let _ = self.ia.device().reject(req, &[]);
                return;
            }
        }
        // DAT_PSP_PROVIDER_FLAG: the provider creates the EP (without PZ or EVDs; the consumer
        // configures it with dat_ep_modify before accepting) and the CR names it.
        let ep = match (&self.ep, self.kind, self.flags & psp_flags::PROVIDER != 0) {
            (Some(ep), _, _) => Some(ep.clone()),
            (None, SpKind::Psp, true) => {
                match Ep::create(&self.ia, None, None, None, None, None, None) {
                    Ok(ep) => {
                        ep.make_provider_tentative(&private_data);
                        Some(ep)
                    }
                    Err(e) => {
                        log::warn!(
                            "PSP {:?}: cannot create an EP for a request: {e}",
                            self.handle
                        );
                        let _ = self.ia.device().reject(req, &[]);
                        return;
                    }
                }
            }
            _ => None,
        };
        let cr = Cr::create(self, req, private_data, remote, ep, ud);
        self.evd.push_provider(Event {
            number: if ud {
                ib_ext::UD_CONNECTION_REQUEST_EVENT
            } else {
                event_number::CONNECTION_REQUEST
            },
            evd: self.evd.handle(),
            data: EventData::CrArrival {
                sp: self.handle,
                local_addr: *local.ip(),
                conn_qual: self.conn_qual(),
                cr: cr.handle(),
            },
        });
    }

    /// dat_psp_free / dat_rsp_free / dat_csp_free. Requests not yet accepted stay valid CRs.
    pub fn free(self: &Arc<Self>) -> DatResult<()> {
        self.ia.remove(self.handle, self.kind.handle_kind())?;
        self.destroy();
        Ok(())
    }

    pub(crate) fn destroy(&self) {
        {
            let mut f = self.freed.lock();
            if *f {
                return;
            }
            *f = true;
        }
        self.listener.close();
        self.ia.unregister_listener(self.listener.id());
        if let Some(ep) = &self.ep {
            ep.unreserve(self.handle);
        }
        self.evd.users.release();
    }

    /// Used by dat_cr_handoff: a live PSP of this IA on `conn_qual`.
    pub(crate) fn find_psp(ia: &Arc<Ia>, conn_qual: u64) -> DatResult<Arc<Sp>> {
        let sps: Vec<Arc<Sp>> = ia
            .sps_by_listener
            .lock()
            .values()
            .filter_map(|w| w.upgrade()?.downcast().ok())
            .collect();
        sps.into_iter()
            .find(|s| s.kind == SpKind::Psp && s.conn_qual() == conn_qual && !*s.freed.lock())
            .ok_or(DatError::bad(Param::Handoff))
    }
}
