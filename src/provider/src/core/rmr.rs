//! RMR: a memory window that exposes part of an LMR to one connection's peer.

use std::sync::Arc;

use parking_lot::Mutex;

use super::consts::{completion_flags, dto_op, mem_priv};
use super::ep::Ep;
use super::error::{DatError, DatResult, ErrorType, SubType};
use super::handle::{self, Handle, HandleKind, Object};
use super::ia::{Ia, PendingDto};
use super::lmr::{access_of, Lmr, VA_TYPE_VA, VA_TYPE_ZB};
use super::pz::Pz;
use crate::backend::{MemoryWindow, SendOp, SendWr};

#[derive(Clone)]
struct Binding {
    lmr: Arc<Lmr>,
    address: u64,
    length: u32,
    lmr_context: u32,
    mem_priv: u32,
    va_type: u32,
    rmr_context: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RmrParam {
    pub ia: Handle,
    pub pz: Handle,
    pub lmr: Handle,
    /// The bound LMR triplet: (virtual_address, segment_length, lmr_context).
    pub lmr_triplet: (u64, u32, u32),
    pub mem_priv: u32,
    pub va_type: u32,
    pub rmr_context: u32,
}

pub struct Rmr {
    handle: Handle,
    ia: Arc<Ia>,
    pz: Arc<Pz>,
    mw: Arc<dyn MemoryWindow>,
    binding: Mutex<Option<Binding>>,
}

impl Rmr {
    /// dat_rmr_create.
    pub fn create(pz: &Arc<Pz>) -> DatResult<Arc<Rmr>> {
        let ia = pz.ia().clone();
        ia.check_open()?;
        pz.acquire()?;
        let mw = match pz.pd().alloc_mw() {
            Ok(mw) => mw,
            Err(e) => {
                pz.users.release();
                return Err(e);
            }
        };
        let reservation = handle::reserve(HandleKind::Rmr);
        let rmr = Arc::new(Rmr {
            handle: reservation.handle(),
            ia: ia.clone(),
            pz: pz.clone(),
            mw,
            binding: Mutex::new(None),
        });
        reservation.commit(Object::Rmr(rmr.clone()), ia.handle());
        Ok(rmr)
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }

    pub fn query(&self) -> RmrParam {
        let b = self.binding.lock().clone();
        match b {
            Some(b) => RmrParam {
                ia: self.ia.handle(),
                pz: self.pz.handle(),
                lmr: b.lmr.handle(),
                lmr_triplet: (b.address, b.length, b.lmr_context),
                mem_priv: b.mem_priv,
                va_type: b.va_type,
                rmr_context: b.rmr_context,
            },
            None => RmrParam {
                ia: self.ia.handle(),
                pz: self.pz.handle(),
                lmr: Handle::NULL,
                lmr_triplet: (0, 0, 0),
                mem_priv: mem_priv::NONE,
                va_type: VA_TYPE_VA,
                rmr_context: self.mw.rkey(),
            },
        }
    }

    /// dat_rmr_bind (2.0 form). `lmr` may be None only for an unbind (length 0). Returns the new
    /// rmr_context; the bind completes in order on the EP's request EVD.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        self: &Arc<Self>,
        lmr: Option<&Arc<Lmr>>,
        triplet: (u64, u32, u32),
        privileges: u32,
        va_type: u32,
        ep: &Arc<Ep>,
        cookie: u64,
        flags: u32,
    ) -> DatResult<u32> {
        let (address, length, lmr_context) = triplet;
        if privileges
            & !(mem_priv::REMOTE_READ
                | mem_priv::REMOTE_WRITE
                | mem_priv::LOCAL_READ
                | mem_priv::LOCAL_WRITE)
            != 0
        {
            return Err(DatError::invalid_arg(5));
        }
        if va_type == VA_TYPE_ZB {
            return Err(DatError::plain(ErrorType::ModelNotSupported));
        }
        if va_type != VA_TYPE_VA {
            return Err(DatError::invalid_arg(6));
        }
        let known = completion_flags::SUPPRESS
            | completion_flags::UNSIGNALLED
            | completion_flags::BARRIER_FENCE;
        if flags & !known != 0 {
            return Err(DatError::invalid_arg(9));
        }
        ep.check_request_flags(flags, 9)?;
        ep.check_request_state()?;
        if !Arc::ptr_eq(&ep.pz_or_err()?, &self.pz) {
            return Err(DatError::new(ErrorType::ProtectionViolation, SubType::None));
        }
        // Length 0 unbinds: the window stops granting access.
        let lmr = if length == 0 {
            None
        } else {
            let lmr = lmr.ok_or_else(|| HandleKind::Lmr.invalid())?;
            if lmr.lmr_context() != lmr_context {
                return Err(DatError::invalid_arg(3));
            }
            if !Arc::ptr_eq(lmr.pz(), &self.pz) {
                return Err(DatError::new(ErrorType::ProtectionViolation, SubType::None));
            }
            if !lmr.contains(address, u64::from(length)) {
                return Err(DatError::invalid_arg(3));
            }
            let lp = lmr.privileges();
            if privileges & mem_priv::REMOTE_READ != 0 && lp & mem_priv::LOCAL_READ == 0 {
                return Err(DatError::new(
                    ErrorType::PrivilegesViolation,
                    SubType::PrivilegesRead,
                ));
            }
            if privileges & mem_priv::REMOTE_WRITE != 0 && lp & mem_priv::LOCAL_WRITE == 0 {
                return Err(DatError::new(
                    ErrorType::PrivilegesViolation,
                    SubType::PrivilegesWrite,
                ));
            }
            Some(lmr.clone())
        };
        let mut binding = self.binding.lock();
        let new_rkey = self.mw.next_rkey();
        let op = SendOp::BindMw {
            mw: self.mw.clone(),
            mr: lmr.as_ref().map(|l| l.mr().clone()),
            addr: address,
            length: u64::from(length),
            access: access_of(privileges) & !crate::backend::access::MW_BIND,
            new_rkey,
        };
        if let Some(l) = &lmr {
            if !l.users.acquire() {
                return Err(HandleKind::Lmr.invalid());
            }
        }
        let report = flags & (completion_flags::SUPPRESS | completion_flags::UNSIGNALLED) == 0;
        let wr = SendWr {
            wr_id: 0,
            op,
            sgl: Vec::new(),
            signaled: true,
            solicited: false,
            fence: true,
        };
        let pending = PendingDto {
            ep: ep.handle(),
            cookie,
            op: dto_op::BIND_MW,
            report_success: report,
            rmr: Some(self.clone()),
        };
        if let Err(e) = ep.post_tracked(wr, pending) {
            if let Some(l) = &lmr {
                l.users.release();
            }
            return Err(e);
        }
        let old = std::mem::replace(
            &mut *binding,
            lmr.map(|l| Binding {
                lmr: l,
                address,
                length,
                lmr_context,
                mem_priv: privileges,
                va_type,
                rmr_context: new_rkey,
            }),
        );
        if let Some(old) = old {
            old.lmr.users.release();
        }
        Ok(new_rkey)
    }

    /// A bind failed after it was posted: the window grants nothing.
    pub(crate) fn bind_failed(&self) {
        if let Some(old) = self.binding.lock().take() {
            old.lmr.users.release();
        }
    }

    /// dat_rmr_free.
    pub fn free(self: &Arc<Self>) -> DatResult<()> {
        handle::remove(self.handle, HandleKind::Rmr)?;
        self.destroy();
        Ok(())
    }

    pub(crate) fn destroy(&self) {
        self.mw.dealloc();
        if let Some(old) = self.binding.lock().take() {
            old.lmr.users.release();
        }
        self.pz.users.release();
    }
}
