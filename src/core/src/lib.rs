//! The safe core: DAT objects, their state machines and rules, over the backend traits.
//!
//! Three layers; a module uses only those of its layer listed before it and those below:
//! - what every object stands on: `consts`, `error`, `counters`, `handle_table` (handle values
//!   and the table of live handles, naming no object), `use_count`, `event` (what an EVD
//!   queues), `pending` (a request's record until its completion), `lmr_table` (what a post
//!   checks of its segments), and `ia` (the IA as its objects see it);
//! - the objects: `pz`, `cno`, `lmr`, `srq`, `completion` (a work completion becomes its
//!   event: the EVD's drain runs it), `evd`, `ep`, `rmr`, `ext` (the IB extensions' posts),
//!   `sp`, `cr`;
//! - what spans them: `handle` (the typed lookups the C layer turns handles into objects
//!   with), `cm` (the device's connection events routed to service points and EPs),
//!   `lifecycle` (an IA's open and close).
//!
//! `error` maps onto DAT_RETURN. The core depends on the backend contract (`daplrs-backend`)
//! and on no backend: an IA is given the function that opens its device
//! (`daplrs::device::open_device` in the provider). The DAT behaviour tests over every device
//! live in the `daplrs` crate, which can open them.
#![deny(unsafe_op_in_unsafe_fn)]

// Below the objects.
pub mod consts;
pub mod counters;
pub mod error;
mod event;
mod handle_table;
pub mod ia;
mod lmr_table;
mod pending;
mod use_count;

// The objects.
pub mod cno;
mod completion;
pub mod cr;
pub mod ep;
pub mod evd;
pub mod ext;
pub mod lmr;
pub mod pz;
pub mod rmr;
pub mod sp;
pub mod srq;

// Above the objects.
mod cm;
pub mod handle;
mod lifecycle;

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
