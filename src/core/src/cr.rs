//! CR: a pending connection request, created when a request reaches a PSP or RSP, consumed by
//! accept, reject or handoff.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::ep::Ep;
use super::error::{DatError, DatResult, Param};
use super::handle_table::{self, Handle, HandleKind};
use super::sp::Sp;
use daplrs_backend::ConnRequestId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrParam {
    pub remote_address: Ipv4Addr,
    pub remote_port: u64,
    pub private_data: Arc<[u8]>,
    pub sp: Handle,
    /// The RSP's reserved EP (NULL for a PSP request).
    pub ep: Handle,
}

pub struct Cr {
    handle: Handle,
    sp: Arc<Sp>,
    req: ConnRequestId,
    private_data: Arc<[u8]>,
    remote: SocketAddrV4,
    ep: Option<Arc<Ep>>,
    /// A datagram EP's address-resolution request (accepted with a datagram EP only).
    ud: bool,
    done: AtomicBool,
}

impl Cr {
    pub(crate) fn create(
        sp: &Arc<Sp>,
        req: ConnRequestId,
        private_data: Vec<u8>,
        remote: SocketAddrV4,
        ep: Option<Arc<Ep>>,
        ud: bool,
    ) -> Arc<Cr> {
        let reservation = sp.ia().reserve(HandleKind::Cr);
        let cr = Arc::new(Cr {
            handle: reservation.handle(),
            sp: sp.clone(),
            req,
            private_data: Arc::from(private_data),
            remote,
            ep,
            ud,
            done: AtomicBool::new(false),
        });
        sp.ia().commit(reservation, &cr);
        cr
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// dat_cr_query.
    pub fn query(&self) -> CrParam {
        CrParam {
            remote_address: *self.remote.ip(),
            remote_port: u64::from(self.remote.port()),
            private_data: self.private_data.clone(),
            sp: self.sp.handle(),
            ep: self.ep.as_ref().map(|e| e.handle()).unwrap_or(Handle::NULL),
        }
    }

    /// The private data stays valid while the CR lives.
    pub fn private_data(&self) -> Arc<[u8]> {
        self.private_data.clone()
    }

    /// Consumes the CR (its handle dies) exactly once.
    fn consume(&self) -> DatResult<()> {
        if self.done.swap(true, Ordering::SeqCst) {
            return Err(HandleKind::Cr.invalid());
        }
        self.sp.ia().remove(self.handle, HandleKind::Cr)
    }

    /// dat_cr_accept: `ep` may be None for an RSP's request (its reserved EP is used).
    pub fn accept(&self, ep: Option<&Arc<Ep>>, private_data: &[u8]) -> DatResult<()> {
        let ia = self.sp.ia().clone();
        if private_data.len() > ia.device().attr().max_private_data as usize {
            return Err(DatError::bad(Param::PrivateDataSize));
        }
        let ep = match (ep, &self.ep) {
            (Some(e), _) => e.clone(),
            (None, Some(e)) => e.clone(),
            (None, None) => return Err(HandleKind::Ep.invalid()),
        };
        if !Arc::ptr_eq(ep.ia(), &ia) {
            return Err(HandleKind::Ep.invalid());
        }
        if !handle_table::is_live(self.handle) || self.done.load(Ordering::SeqCst) {
            return Err(HandleKind::Cr.invalid());
        }
        // A datagram request is answered by a datagram EP, a connection request by a
        // connection EP (OFED's provider says DAT_INVALID_HANDLE_EP to a mismatch too).
        if self.ud != ep.is_ud() {
            return Err(HandleKind::Ep.invalid());
        }
        if self.ud {
            let qp = ep.begin_ud_accept()?;
            let answered = ia.device().ud_accept(self.req, &qp, private_data);
            // Answered or not, the request is spent.
            self.consume()?;
            ep.on_ud_resolved(answered?, self.private_data.to_vec(), true);
            return Ok(());
        }
        let qp = ep.begin_accept(self.remote, &self.private_data)?;
        if let Err(e) = ia.device().accept(self.req, &qp, private_data) {
            ep.abort_accept();
            // The request is gone (peer gave up): the CR is spent either way.
            let _ = self.consume();
            return Err(e.into());
        }
        self.consume()
    }

    /// dat_cr_reject.
    pub fn reject(&self, private_data: &[u8]) -> DatResult<()> {
        let ia = self.sp.ia().clone();
        if private_data.len() > ia.device().attr().max_private_data as usize {
            return Err(DatError::bad(Param::PrivateDataSize));
        }
        self.consume()?;
        if let Some(ep) = &self.ep {
            ep.unreserve(self.sp.handle());
        }
        let _ = ia.device().reject(self.req, private_data);
        Ok(())
    }

    /// dat_cr_handoff: passes the request to this IA's PSP on `conn_qual`.
    pub fn handoff(&self, conn_qual: u64) -> DatResult<()> {
        let target = Sp::find_psp(self.sp.ia(), conn_qual)?;
        self.consume()?;
        target.on_connect_request(
            self.req,
            self.private_data.to_vec(),
            self.remote,
            SocketAddrV4::new(self.sp.ia().address(), target.port()),
            self.ud,
        );
        Ok(())
    }

    /// Abrupt teardown: an unanswered request is rejected.
    pub(crate) fn destroy(&self) {
        if !self.done.swap(true, Ordering::SeqCst) {
            let _ = self.sp.ia().device().reject(self.req, &[]);
        }
    }
}
