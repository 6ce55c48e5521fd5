//! PZ: a protection zone, backed by a backend protection domain.

use std::sync::Arc;

use super::error::{DatError, DatResult, SubType};
use super::handle_table::{self, Handle, HandleKind};
use super::ia::Ia;
use super::use_count::UseCount;
use daplrs_backend::ProtectionDomain;

pub struct Pz {
    handle: Handle,
    ia: Arc<Ia>,
    pd: Arc<dyn ProtectionDomain>,
    /// EPs, LMRs, RMRs and SRQs in this PZ.
    pub(crate) users: UseCount,
}

impl Pz {
    /// dat_pz_create.
    pub fn create(ia: &Arc<Ia>) -> DatResult<Arc<Pz>> {
        ia.check_open()?;
        ia.check_room(
            HandleKind::Pz,
            ia.device().attr().max_pd,
            SubType::ResourceProtectionDomain,
        )?;
        let pd = ia.device().alloc_pd()?;
        let reservation = ia.reserve(HandleKind::Pz);
        let pz = Arc::new(Pz {
            handle: reservation.handle(),
            ia: ia.clone(),
            pd,
            users: UseCount::default(),
        });
        ia.commit(reservation, &pz);
        Ok(pz)
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }
    pub fn ia(&self) -> &Arc<Ia> {
        &self.ia
    }
    pub(crate) fn pd(&self) -> &Arc<dyn ProtectionDomain> {
        &self.pd
    }

    /// dat_pz_query: the IA handle.
    pub fn query(&self) -> Handle {
        self.ia.handle()
    }

    /// Records a user; INVALID_HANDLE PZ if the PZ is being freed.
    pub(crate) fn acquire(&self) -> DatResult<()> {
        if self.users.acquire() {
            Ok(())
        } else {
            Err(HandleKind::Pz.invalid())
        }
    }

    /// dat_pz_free: refused (INVALID_STATE PZ_IN_USE) while an EP, LMR, RMR or SRQ uses it.
    pub fn free(self: &Arc<Self>) -> DatResult<()> {
        if !handle_table::is_live(self.handle) {
            return Err(HandleKind::Pz.invalid());
        }
        if self.users.retire().is_err() {
            return Err(DatError::invalid_state(SubType::PzInUse));
        }
        self.ia.remove(self.handle, HandleKind::Pz)?;
        self.destroy();
        Ok(())
    }

    pub(crate) fn destroy(&self) {
        self.users.force_retire();
    }
}
