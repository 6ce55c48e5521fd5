//! LMR: a registered local memory region. Its lmr_context is the backend lkey and its
//! rmr_context the backend rkey; both are unique among live registrations of the device.

use std::sync::{Arc, Weak};

use super::consts::mem_priv;
use super::error::{from_backend, DatError, DatResult, ErrorType, Param, SubType};
use super::handle_table::{self, AnyObject, Handle, HandleKind};
use super::ia::Ia;
use super::lmr_table::RegionCheck;
use super::pz::Pz;
use super::use_count::UseCount;
use daplrs_backend::{self as backend, access, MemoryRegion};

/// DAT_VA_TYPE.
pub const VA_TYPE_VA: u32 = 0;
pub const VA_TYPE_ZB: u32 = 1;

/// Where the memory of a new LMR comes from (DAT_MEM_TYPE + DAT_REGION_DESCRIPTION).
pub enum LmrRegion {
    /// DAT_MEM_TYPE_VIRTUAL: a range of this process's address space.
    Virtual { address: u64, length: u64 },
    /// DAT_MEM_TYPE_LMR: the same memory as an existing LMR.
    Lmr(Arc<Lmr>),
    /// DAT_MEM_TYPE_SHARED_VIRTUAL: a range of this process's address space that is memory
    /// shared with other processes, named by the consumer's 40-byte shared-memory id. Each
    /// process registers its own mapping, as any range is registered; the id is kept and
    /// reported by dat_lmr_query.
    SharedVirtual {
        address: u64,
        length: u64,
        id: [u8; 40],
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LmrParam {
    pub ia: Handle,
    /// DAT_MEM_TYPE_VIRTUAL (0), DAT_MEM_TYPE_LMR (1) or DAT_MEM_TYPE_SHARED_VIRTUAL (2).
    pub mem_type: u32,
    /// The shared-memory id of a SHARED_VIRTUAL LMR.
    pub shared_id: Option<[u8; 40]>,
    pub address: u64,
    pub length: u64,
    pub pz: Handle,
    pub mem_priv: u32,
    pub va_type: u32,
    pub lmr_context: u32,
    pub rmr_context: u32,
    pub registered_size: u64,
    pub registered_address: u64,
}

pub struct Lmr {
    handle: Handle,
    ia: Arc<Ia>,
    pz: Arc<Pz>,
    mr: Arc<dyn MemoryRegion>,
    mem_type: u32,
    shared_id: Option<[u8; 40]>,
    mem_priv: u32,
    va_type: u32,
    /// RMRs bound into this LMR.
    pub(crate) users: UseCount,
}

/// Maps DAT privileges onto backend access flags.
pub(crate) fn access_of(privileges: u32) -> u32 {
    let mut a = access::MW_BIND;
    // Remote write or atomic access needs local write too (verbs refuses them without it).
    if privileges & (mem_priv::LOCAL_WRITE | mem_priv::REMOTE_WRITE | mem_priv::REMOTE_ATOMIC) != 0
    {
        a |= access::LOCAL_WRITE;
    }
    if privileges & mem_priv::REMOTE_ATOMIC != 0 {
        a |= access::REMOTE_ATOMIC;
    }
    if privileges & mem_priv::REMOTE_WRITE != 0 {
        a |= access::REMOTE_WRITE;
    }
    if privileges & mem_priv::REMOTE_READ != 0 {
        a |= access::REMOTE_READ;
    }
    a
}

impl Lmr {
    /// dat_lmr_create.
    ///
    /// The caller guarantees a `Virtual` range stays mapped until the LMR is freed (DAT's rule
    /// for the consumer).
    pub fn create(
        ia: &Arc<Ia>,
        region: LmrRegion,
        pz: &Arc<Pz>,
        privileges: u32,
        va_type: u32,
    ) -> DatResult<Arc<Lmr>> {
        ia.check_open()?;
        if !Arc::ptr_eq(pz.ia(), ia) {
            return Err(HandleKind::Pz.invalid());
        }
        if privileges & !mem_priv::KNOWN != 0 {
            return Err(DatError::bad(Param::Privileges));
        }
        if va_type == VA_TYPE_ZB {
            return Err(DatError::plain(ErrorType::ModelNotSupported));
        }
        if va_type != VA_TYPE_VA {
            return Err(DatError::bad(Param::VaType));
        }
        let (address, length, mem_type, shared_id) = match &region {
            LmrRegion::Virtual { address, length } => (*address, *length, 0, None),
            LmrRegion::Lmr(other) => (other.mr.addr(), other.mr.length(), 1, None),
            LmrRegion::SharedVirtual {
                address,
                length,
                id,
            } => (*address, *length, 2, Some(*id)),
        };
        // An empty region is a length error (DAT_LENGTH_ERROR), as dapltest's
        // "register memory with size 0" case and OFED's provider have it.
        if length == 0 {
            return Err(DatError::length());
        }
        if address == 0 || address.checked_add(length).is_none() {
            return Err(DatError::bad(Param::RegionDescription));
        }
        if length > ia.device().attr().max_mr_size {
            return Err(DatError::bad(Param::Length));
        }
        // Memory that is not there, or not writable when writes are asked for, is refused as
        // an RDMA device refuses it (EFAULT), on every backend: rs-tcp pins nothing and would
        // later read or write it for a peer; a verbs device pins memory asked for reading only
        // with the kernel's FOLL_FORCE, which takes even PROT_NONE memory.
        // Asking costs a system call or more per registration: a device that pins what it
        // registers for writing refuses such memory itself, with the same error.
        let write = mem_priv::LOCAL_WRITE | mem_priv::REMOTE_WRITE | mem_priv::REMOTE_ATOMIC;
        let writable = privileges & write != 0;
        let device_checks = writable && ia.device().attr().pins_for_write;
        if !device_checks && !daplrs_backend::mapping::mapped(address, length, writable) {
            return Err(DatError::bad(Param::RegionDescription));
        }
        ia.check_room(
            HandleKind::Lmr,
            ia.device().attr().max_mr,
            SubType::ResourceMemoryRegion,
        )?;
        pz.acquire()?;
        let access = access_of(privileges);
        let mut registered = pz.pd().reg_mr(address, length, access);
        if access & access::LOCAL_WRITE == 0
            && registered.as_ref().err() == Some(&backend::Error::BadAddress)
        {
            // Read-only memory (a constant table, a file mapped read-only): the right to bind
            // windows makes a verbs device pin the pages for writing, which it refuses. Without
            // it the LMR serves sends and remote reads; only binding an RMR into it fails.
            registered = pz.pd().reg_mr(address, length, access & !access::MW_BIND);
        }
        let mr = match registered {
            Ok(mr) => mr,
            Err(e) => {
                pz.users.release();
                return Err(match e {
                    // The device cannot grant exactly these privileges: a peer would get more.
                    backend::Error::Unsupported => DatError::plain(ErrorType::ModelNotSupported),
                    e => from_backend(e, Some(Param::RegionDescription)),
                });
            }
        };
        let reservation = ia.reserve(HandleKind::Lmr);
        let lmr = Arc::new(Lmr {
            handle: reservation.handle(),
            ia: ia.clone(),
            pz: pz.clone(),
            mr,
            mem_type,
            shared_id,
            mem_priv: privileges,
            va_type,
            users: UseCount::default(),
        });
        let entered = ia.lmrs.insert(
            lmr.mr.lkey(),
            Arc::downgrade(&lmr) as Weak<AnyObject>,
            RegionCheck {
                pz: Arc::as_ptr(pz) as usize,
                addr: lmr.mr.addr(),
                len: lmr.mr.length(),
                privileges,
            },
        );
        if !entered {
            lmr.mr.deregister();
            pz.users.release();
            return Err(DatError::new(
                ErrorType::InsufficientResources,
                SubType::None,
            ));
        }
        ia.commit(reservation, &lmr);
        Ok(lmr)
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }
    pub fn pz(&self) -> &Arc<Pz> {
        &self.pz
    }
    pub fn lmr_context(&self) -> u32 {
        self.mr.lkey()
    }
    pub fn rmr_context(&self) -> u32 {
        self.mr.rkey()
    }
    pub fn address(&self) -> u64 {
        self.mr.addr()
    }
    pub fn length(&self) -> u64 {
        self.mr.length()
    }
    pub fn privileges(&self) -> u32 {
        self.mem_priv
    }
    pub(crate) fn mr(&self) -> &Arc<dyn MemoryRegion> {
        &self.mr
    }

    /// Whether [addr, addr+len) lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let start = self.mr.addr();
        let Some(end) = start.checked_add(self.mr.length()) else {
            return false;
        };
        match addr.checked_add(len) {
            Some(e) => addr >= start && e <= end,
            None => false,
        }
    }

    pub fn query(&self) -> LmrParam {
        LmrParam {
            ia: self.ia.handle(),
            mem_type: self.mem_type,
            shared_id: self.shared_id,
            address: self.mr.addr(),
            length: self.mr.length(),
            pz: self.pz.handle(),
            mem_priv: self.mem_priv,
            va_type: self.va_type,
            lmr_context: self.mr.lkey(),
            rmr_context: self.mr.rkey(),
            registered_size: self.mr.length(),
            registered_address: self.mr.addr(),
        }
    }

    /// dat_lmr_free: refused while an RMR is bound into the region.
    pub fn free(self: &Arc<Self>) -> DatResult<()> {
        if !handle_table::is_live(self.handle) {
            return Err(HandleKind::Lmr.invalid());
        }
        if self.users.retire().is_err() {
            return Err(DatError::invalid_state(SubType::LmrInUse));
        }
        self.ia.remove(self.handle, HandleKind::Lmr)?;
        self.destroy();
        Ok(())
    }

    pub(crate) fn destroy(&self) {
        self.users.force_retire();
        self.ia.lmrs.remove(self.mr.lkey());
        self.mr.deregister();
        self.pz.users.release();
    }
}

impl Ia {
    /// The live LMR of this IA whose lmr_context is `lmr_context` (DAT 1.2's dat_rmr_bind
    /// names the LMR by its triplet's context only).
    pub fn lmr_by_context(&self, lmr_context: u32) -> Option<Arc<Lmr>> {
        self.lmrs.lmr(lmr_context)?.downcast().ok()
    }
}

/// dat_lmr_sync_rdma_read / _write: memory is coherent on this transport, so only the
/// segments are checked.
pub fn sync_rdma(ia: &Arc<Ia>, segments: &[(u64, u64)]) -> DatResult<()> {
    ia.check_open()?;
    if segments.is_empty() {
        return Err(DatError::bad(Param::NumSegments));
    }
    for &(addr, len) in segments {
        if addr.checked_add(len).is_none() {
            return Err(DatError::bad(Param::LocalSegments));
        }
    }
    Ok(())
}
