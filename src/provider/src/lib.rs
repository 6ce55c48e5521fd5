//! The provider's Rust side: the device factory (`device`) over the core (`daplrs-core`) and the
//! backends (`daplrs-tcp`; `daplrs-ibverbs` with the feature `verbs`), under the paths the C
//! layer (src/provider-ffi) and the tools use: `daplrs::core::...`, `daplrs::backend::...`.
//!
//! The crates below it: `daplrs-backend` (the contract), the backends (each on the contract
//! alone), the core (on the contract alone). Only this crate knows them all, so the DAT
//! behaviour tests that run over every device live here (`behaviour_tests`, `testing`).
#![deny(unsafe_op_in_unsafe_fn)]

pub use daplrs_core as core;

/// The backend contract and the backends, under one path.
pub mod backend {
    pub use daplrs_backend::*;
    #[cfg(feature = "verbs")]
    pub use daplrs_ibverbs as verbs;
    #[cfg(feature = "ofi")]
    pub use daplrs_libfabric as ofi;
    pub use daplrs_tcp as tcp;
}

pub mod device;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;

#[cfg(test)]
mod behaviour_tests;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
use device::open_device;
