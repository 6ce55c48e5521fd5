//! libdaplrs-ofi.so.2: the same provider as libdaplrs.so.2 (same C layer, same core), built
//! with the `ofi` feature, so its IAs may name a libfabric provider ("ofi tcp lo") as well as
//! a TCP interface (docs/libfabric.md).
//!
//! A library of its own so that libdaplrs.so.2 keeps no link to libfabric: only entries that
//! name this library need libfabric's runtime.
#![deny(unsafe_op_in_unsafe_fn)]

pub use daplrs_ffi::{dat_provider_fini, dat_provider_init};
