//! The DAT 2.0 C ABI, written once in Rust.
//!
//! Every type here is `repr(C)` and laid out exactly as OFED's uDAPL 2.0
//! headers lay it out on x86_64 Linux (see `tests-c/programs/abi_compare.c`, which
//! asserts this at compile time against Debian's `<dat2/udat.h>`). cbindgen
//! turns this crate into `include/dat2/dat_types.h`; nothing here has logic.
//!
//! Naming follows C: structs are declared under their C *tag*
//! (`dat_ep_attr`) with the C typedef name (`DAT_EP_ATTR`) as an alias, so
//! that both `struct dat_ep_attr` and `DAT_EP_ATTR` work in C source.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod basic;
pub mod codes;
pub mod consts;
pub mod ib_ext;
pub mod provider;
pub mod structs;

pub use basic::*;
pub use codes::*;
pub use consts::*;
pub use provider::*;
pub use structs::*;
