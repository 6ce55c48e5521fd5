//! RMR: a memory window that exposes part of an LMR to one connection's peer.
//!
//! Locking: a bind posts to the EP's QP, and a backend may deliver completions synchronously
//! inside that post (a QP in error state flushes at once, on the caller's thread, through the
//! EVD to `bind_failed`). So no lock that the completion path takes (`state`) is held across
//! the post; `bind_order` only keeps binds of one RMR in post order (the rkey of a bind derives
//! from the previous one) and nothing on the completion path takes it.

use std::any::Any;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::consts::{completion_flags, dto_op, mem_priv};
use super::ep::{Ep, RemoteBuffer};
use super::error::{DatError, DatResult, ErrorType, Param, SubType};
use super::handle_table::{Handle, HandleKind};
use super::ia::Ia;
use super::lmr::{access_of, Lmr, VA_TYPE_VA, VA_TYPE_ZB};
use super::pending::{PendingDto, Window};
use super::pz::Pz;
use daplrs_backend::{MemoryWindow, SendOp, SendWr, Sge, SgeList, WrContext};

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

/// What the RMR is bound to, as the consumer last asked.
struct BindState {
    /// The binding of the last bind posted (None: unbound). Installed before the bind is
    /// posted, so that a failure or flush, however early it is delivered, finds and ends it.
    binding: Option<Binding>,
    /// The rmr_context of the last bind posted (or 0): a failure of an older bind must not end
    /// the binding of a newer one.
    posted: u32,
}

pub struct Rmr {
    handle: Handle,
    ia: Arc<Ia>,
    pz: Arc<Pz>,
    mw: Arc<dyn MemoryWindow>,
    state: Mutex<BindState>,
    bind_order: Mutex<()>,
}

impl Rmr {
    /// dat_rmr_create.
    pub fn create(pz: &Arc<Pz>) -> DatResult<Arc<Rmr>> {
        let ia = pz.ia().clone();
        ia.check_open()?;
        ia.check_room(
            HandleKind::Rmr,
            ia.device().attr().max_mw,
            SubType::ResourceMemoryRegion,
        )?;
        pz.acquire()?;
        let mw = match pz.pd().alloc_mw() {
            Ok(mw) => mw,
            Err(e) => {
                pz.users.release();
                return Err(e.into());
            }
        };
        let reservation = ia.reserve(HandleKind::Rmr);
        let rmr = Arc::new(Rmr {
            handle: reservation.handle(),
            ia: ia.clone(),
            pz: pz.clone(),
            mw,
            state: Mutex::new(BindState {
                binding: None,
                posted: 0,
            }),
            bind_order: Mutex::new(()),
        });
        ia.commit(reservation, &rmr);
        Ok(rmr)
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// The IA this RMR belongs to.
    pub fn ia(&self) -> &Arc<Ia> {
        &self.ia
    }

    pub fn query(&self) -> RmrParam {
        let b = self.state.lock().binding.clone();
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
                | mem_priv::REMOTE_ATOMIC
                | mem_priv::LOCAL_READ
                | mem_priv::LOCAL_WRITE)
            != 0
        {
            return Err(DatError::bad(Param::MemPriv));
        }
        if va_type == VA_TYPE_ZB {
            return Err(DatError::plain(ErrorType::ModelNotSupported));
        }
        if va_type != VA_TYPE_VA {
            return Err(DatError::bad(Param::VaType));
        }
        let known = completion_flags::SUPPRESS
            | completion_flags::UNSIGNALLED
            | completion_flags::BARRIER_FENCE;
        if flags & !known != 0 {
            return Err(DatError::bad(Param::CompletionFlags));
        }
        ep.check_request_flags(flags)?;
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
                return Err(DatError::bad(Param::LmrTriplet));
            }
            if !Arc::ptr_eq(lmr.pz(), &self.pz) {
                return Err(DatError::new(ErrorType::ProtectionViolation, SubType::None));
            }
            if !lmr.contains(address, u64::from(length)) {
                return Err(DatError::bad(Param::LmrTriplet));
            }
            let lp = lmr.privileges();
            if privileges & mem_priv::REMOTE_READ != 0 && lp & mem_priv::LOCAL_READ == 0 {
                return Err(DatError::new(
                    ErrorType::PrivilegesViolation,
                    SubType::PrivilegesRead,
                ));
            }
            if privileges & (mem_priv::REMOTE_WRITE | mem_priv::REMOTE_ATOMIC) != 0
                && lp & mem_priv::LOCAL_WRITE == 0
            {
                return Err(DatError::new(
                    ErrorType::PrivilegesViolation,
                    SubType::PrivilegesWrite,
                ));
            }
            Some(lmr.clone())
        };
        let _order = self.bind_order.lock();
        let new_rkey = self.mw.next_rkey();
        let op = SendOp::BindMw {
            mw: self.mw.clone(),
            mr: lmr.as_ref().map(|l| l.mr().clone()),
            addr: address,
            length: u64::from(length),
            access: access_of(privileges) & !daplrs_backend::access::MW_BIND,
            new_rkey,
        };
        if let Some(l) = &lmr {
            if !l.users.acquire() {
                return Err(HandleKind::Lmr.invalid());
            }
        }
        let report = Ep::report_success(flags);
        let mut wr = SendWr {
            wr_id: 0,
            ctx: WrContext::NONE,
            op,
            sgl: SgeList::new(),
            signaled: true,
            solicited: false,
            fence: true,
        };
        let pending = PendingDto {
            ep: ep.handle(),
            cookie,
            op: dto_op::BIND_MW,
            report_success: report,
            rmr: Some((self.clone() as Arc<dyn Window>, new_rkey)),
            ext: None,
        };
        let new_binding = lmr.map(|l| Binding {
            lmr: l,
            address,
            length,
            lmr_context,
            mem_priv: privileges,
            va_type,
            rmr_context: new_rkey,
        });
        let (old, old_posted) = {
            let mut st = self.state.lock();
            let old_posted = std::mem::replace(&mut st.posted, new_rkey);
            (std::mem::replace(&mut st.binding, new_binding), old_posted)
        };
        // No lock of this RMR is held here but `bind_order` (see the module comment).
        if let Err(e) = ep.post_tracked(None, &mut wr, pending) {
            // Nothing was posted, so nothing of this bind was delivered: put the old state back.
            let mine = {
                let mut st = self.state.lock();
                st.posted = old_posted;
                std::mem::replace(&mut st.binding, old)
            };
            if let Some(mine) = mine {
                mine.lmr.users.release();
            }
            return Err(e);
        }
        if let Some(old) = old {
            old.lmr.users.release();
        }
        if length > 0 {
            self.ia
                .rmrs_by_context
                .lock()
                .insert(new_rkey, Arc::downgrade(self) as Weak<dyn Window>);
        }
        Ok(new_rkey)
    }

    pub(crate) fn pz(&self) -> &Arc<Pz> {
        &self.pz
    }

    /// The local memory the binding `rmr_context` names, as a segment of its LMR, if the range
    /// [address, address+length) lies inside the binding and it grants one of the privileges
    /// in `any_of` (used by dat_ep_post_rdma_read_to_rmr, whose sink is an RMR of ours).
    pub(crate) fn local_segment(
        &self,
        rmr_context: u32,
        address: u64,
        length: u32,
        any_of: u32,
    ) -> Option<Sge> {
        let st = self.state.lock();
        let b = st.binding.as_ref()?;
        if st.posted != rmr_context || b.mem_priv & any_of == 0 {
            return None;
        }
        let end = address.checked_add(u64::from(length))?;
        if address < b.address || end > b.address + u64::from(b.length) {
            return None;
        }
        Some(Sge {
            addr: address,
            length,
            lkey: b.lmr.lmr_context(),
        })
    }

    /// dat_rmr_free.
    pub fn free(self: &Arc<Self>) -> DatResult<()> {
        self.ia.remove(self.handle, HandleKind::Rmr)?;
        self.destroy();
        Ok(())
    }

    pub(crate) fn destroy(&self) {
        self.mw.dealloc();
        let old = self.state.lock().binding.take();
        if let Some(old) = old {
            old.lmr.users.release();
        }
        self.pz.users.release();
    }
}

impl Window for Rmr {
    fn handle(&self) -> Handle {
        self.handle
    }

    /// Whether the RMR's current binding is the one `rmr_context` names.
    fn is_bound_as(&self, rmr_context: u32) -> bool {
        let st = self.state.lock();
        st.posted == rmr_context && st.binding.is_some()
    }

    /// The bind that gave `rmr_context` failed or was flushed after it was posted: unless a
    /// later bind was posted since, the RMR is left unbound and the window grants nothing.
    fn bind_failed(&self, rmr_context: u32) {
        let old = {
            let mut st = self.state.lock();
            if st.posted != rmr_context {
                return;
            }
            // The window stops granting access before the LMR can be freed.
            self.mw.invalidate();
            st.binding.take()
        };
        if let Some(old) = old {
            old.lmr.users.release();
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Ep {
    /// dat_ep_post_rdma_read_to_rmr: an RDMA read whose sink is an RMR of ours, named by its
    /// triplet (rmr_context of its current binding, address, length) instead of an LMR
    /// triplet. The range must lie inside the binding, which must grant write (local or
    /// remote); the read then lands in the LMR the RMR is bound into, exactly as
    /// dat_ep_post_rdma_read into that range. Here, with the RMR it reads into.
    pub fn post_rdma_read_to_rmr(
        &self,
        local: RemoteBuffer,
        cookie: u64,
        remote: RemoteBuffer,
        flags: u32,
    ) -> DatResult<()> {
        let no_rmr = DatError::new(ErrorType::PrivilegesViolation, SubType::PrivilegesWrite);
        let window = self.ia().rmr_by_context(local.rmr_context).ok_or(no_rmr)?;
        let rmr = window.as_any().downcast_ref::<Rmr>().ok_or(no_rmr)?;
        let sge = rmr
            .local_segment(
                local.rmr_context,
                local.address,
                local.length,
                mem_priv::LOCAL_WRITE | mem_priv::REMOTE_WRITE,
            )
            .ok_or(DatError::bad(Param::LocalIov))?;
        if !Arc::ptr_eq(rmr.pz(), &self.pz_or_err()?) {
            return Err(DatError::new(
                ErrorType::ProtectionViolation,
                SubType::ProtectionWrite,
            ));
        }
        // Its one local segment is the RMR triplet, which this call has instead of a count
        // and an LMR IOV: what dat_ep_post_rdma_read says of the segments is said of it.
        self.post_rdma_read(&[sge], cookie, remote, flags)
            .map_err(|e| match e.param {
                Some(Param::NumSegments) => DatError::bad(Param::LocalIov),
                _ => e,
            })
    }
}
