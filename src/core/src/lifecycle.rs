//! An IA's open and close: the two steps that involve every kind of object, so they stand
//! above all of them. Opening gives the device its connection-event handler (`cm`) and the IA
//! its async EVD; closing abruptly tears down whatever the consumer left, in the order in which
//! objects use each other.

use std::sync::Arc;

use super::cm;
use super::consts::{close_flags, evd_flags};
use super::error::{DatError, DatResult, Param, SubType};
use super::evd::Evd;
use super::handle::{self, Object};
use super::handle_table::{self, Handle, HandleKind};
use super::ia::{AsyncEvd, Ia, OpenDevice};

impl Ia {
    /// dat_ia_open: opens the device named by `ia_params` ("tcp lo", "tcp 10.0.0.1", ...)
    /// with `open_device`.
    /// With `async_evd_qlen`, also creates the IA's async EVD (the DAT_HANDLE_NULL case);
    /// without, the caller names an existing one or none (see `Ia::open_with_async_evd`).
    /// `dispatch` is the C table this IA's handles start with (see `Ia::dispatch`).
    pub fn open(
        name: &str,
        ia_params: &str,
        open_device: OpenDevice,
        async_evd_qlen: Option<i32>,
        dispatch: usize,
    ) -> DatResult<(Arc<Ia>, Option<Arc<Evd>>)> {
        let async_evd = match async_evd_qlen {
            Some(qlen) => AsyncEvd::Create(qlen),
            None => AsyncEvd::None,
        };
        Self::open_with_async_evd(name, ia_params, open_device, async_evd, dispatch)
    }

    /// dat_ia_open with the consumer's choice of async EVD. An existing one must be a live EVD
    /// created with DAT_EVD_ASYNC_FLAG (of any IA: one EVD may collect the async errors of
    /// several), checked before the device is opened.
    pub fn open_with_async_evd(
        name: &str,
        ia_params: &str,
        open_device: OpenDevice,
        async_evd: AsyncEvd,
        dispatch: usize,
    ) -> DatResult<(Arc<Ia>, Option<Arc<Evd>>)> {
        let existing = match async_evd {
            AsyncEvd::Existing(h) => {
                let evd = handle::evd(h, SubType::InvalidHandleEvdAsync)?;
                if evd.flags() & evd_flags::ASYNC == 0 {
                    return Err(DatError::invalid_handle(SubType::InvalidHandleEvdAsync));
                }
                Some(evd)
            }
            _ => None,
        };
        let async_evd_qlen = match async_evd {
            AsyncEvd::Create(qlen) => Some(qlen),
            _ => None,
        };
        let device = open_device(ia_params)?;
        let (ia, reservation) = Ia::new(name, device.clone(), dispatch);
        let weak = Arc::downgrade(&ia);
        device.set_cm_handler(Some(Arc::new(move |ev| {
            if let Some(ia) = weak.upgrade() {
                cm::on_cm_event(&ia, ev);
            }
        })));
        reservation.commit(ia.clone(), Handle::NULL);
        let async_evd = match async_evd_qlen {
            Some(qlen) => match Evd::create(&ia, qlen, None, evd_flags::ASYNC) {
                Ok(evd) => {
                    ia.adopt_async_evd(&evd, true);
                    Some(evd)
                }
                Err(e) => {
                    let _ = ia.close(close_flags::ABRUPT);
                    return Err(e);
                }
            },
            None => None,
        };
        if let Some(evd) = existing {
            ia.adopt_async_evd(&evd, false);
        }
        Ok((ia, async_evd))
    }

    /// dat_ia_close. Graceful fails with INVALID_STATE IA_IN_USE while any object other than the
    /// implicit async EVD remains; abrupt destroys every child first.
    pub fn close(self: &Arc<Self>, flags: u32) -> DatResult<()> {
        if !handle_table::is_live(self.handle()) {
            return Err(HandleKind::Ia.invalid());
        }
        let implicit_async = self.implicit_async_evd();
        let mut children = handle::children(self.handle());
        if flags == close_flags::GRACEFUL {
            if children.iter().any(|(h, _)| Some(*h) != implicit_async) {
                return Err(DatError::invalid_state(SubType::IaInUse));
            }
        } else if flags != close_flags::ABRUPT {
            return Err(DatError::bad(Param::CloseFlags));
        }
        self.mark_closed();
        children.sort_by_key(|(_, o)| teardown_rank(o));
        for (h, obj) in children {
            if self.remove(h, obj.kind()).is_err() {
                continue; // freed concurrently by its owner
            }
            destroy_object(&obj);
        }
        handle_table::remove(self.handle(), HandleKind::Ia)?;
        self.release_device();
        Ok(())
    }
}

/// Children die before what they use: EPs, then CRs and service points, RMRs, LMRs, SRQs,
/// EVDs, CNOs, PZs.
fn teardown_rank(o: &Object) -> u8 {
    match o {
        Object::Ep(_) => 0,
        Object::Cr(_) => 1,
        Object::Psp(_) | Object::Rsp(_) | Object::Csp(_) => 2,
        Object::Rmr(_) => 3,
        Object::Lmr(_) => 4,
        Object::Srq(_) => 5,
        Object::Evd(_) => 6,
        Object::Cno(_) => 7,
        Object::Pz(_) => 8,
        Object::Ia(_) => 9,
    }
}

fn destroy_object(o: &Object) {
    match o {
        Object::Ep(x) => x.destroy(),
        Object::Cr(x) => x.destroy(),
        Object::Psp(x) | Object::Rsp(x) | Object::Csp(x) => x.destroy(),
        Object::Rmr(x) => x.destroy(),
        Object::Lmr(x) => x.destroy(),
        Object::Srq(x) => x.destroy(),
        Object::Evd(x) => x.destroy(),
        Object::Cno(x) => x.destroy(),
        Object::Pz(x) => x.destroy(),
        Object::Ia(_) => {}
    }
}
