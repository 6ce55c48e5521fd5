//! The safe core: DAT objects, their state machines and rules, over the backend traits.
//!
//! Every object type has its module; `handle` is the one handle mechanism the ffi layer uses to
//! turn C handles into objects; `error` maps onto DAT_RETURN.
//!
//! The core depends on the backend contract (`daplrs-backend`) and on no backend: an IA is
//! given the function that opens its device (`daplrs::device::open_device` in the provider).
//! The DAT behaviour tests over every device live in the `daplrs` crate, which can open them.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cno;
pub mod consts;
pub mod counters;
pub mod cr;
pub mod ep;
pub mod error;
pub mod evd;
pub mod ext;
pub mod handle;
pub mod ia;
pub mod lmr;
mod lmr_table;
pub mod pz;
pub mod rmr;
pub mod sp;
pub mod srq;

/// Objects print as their kind and handle (their state lives behind locks).
macro_rules! debug_by_handle {
    ($($ty:ty),*) => {$(
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({:#x})", stringify!($ty), self.handle().addr())
            }
        }
    )*};
}
debug_by_handle!(
    ia::Ia,
    pz::Pz,
    lmr::Lmr,
    rmr::Rmr,
    evd::Evd,
    cno::Cno,
    ep::Ep,
    sp::Sp,
    cr::Cr,
    srq::Srq
);

#[cfg(test)]
mod tests;
