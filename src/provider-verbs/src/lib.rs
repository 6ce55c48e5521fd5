//! libdaplrs-verbs.so.2: the same provider as libdaplrs.so.2 (same C layer, same core), built
//! with the core's `verbs` feature, so its IAs may name an RDMA device ("verbs rxe0 1") as well
//! as a TCP interface.
//!
//! It is a library of its own so that libdaplrs.so.2 keeps no link to libibverbs/librdmacm:
//! rs-tcp loads on any Linux host, and only entries that name this library need rdma-core's
//! runtime.
#![deny(unsafe_op_in_unsafe_fn)]

pub use daplrs_ffi::{dat_provider_fini, dat_provider_init};
