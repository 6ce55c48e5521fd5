//! The DAT 1.2 C ABI (`<dat/udat.h>`, `libdat.so.1`), written once in Rust.
//!
//! The same conventions as `dat-abi` (DAT 2.0): every type is `repr(C)` and
//! laid out as the DAT 1.2 headers lay it out on x86_64 Linux; structs are
//! declared under their C tag (`dat_ep_attr`) with the C typedef name
//! (`DAT_EP_ATTR`) as an alias; a C enum is a `u32` typedef plus one
//! constant per member. No logic. cbindgen turns this crate into
//! `include/dat/dat_types.h` (`make header`).
//!
//! What 1.2 and 2.0 share unchanged (scalars, handles, `DAT_CONTEXT`, most
//! parameter structs, the function-pointer types whose arguments did not
//! change) is not repeated: each module re-exports it from `dat-abi`, and
//! `gen-header` lets cbindgen read `dat-abi` for those definitions. Every
//! name 1.2 gives another shape or value (triplets, events, attributes,
//! enum members, return codes, the provider table) is defined here, and the
//! names declared here win over `dat-abi`'s in the generated header.
//! Constants are always written here, never re-exported: cbindgen emits the
//! constants of this crate only.
//!
//! The layout facts (24-byte triplets, 48-byte DAT_EVENT, the u64
//! `transfered_length` at offset 24, 104-byte DAT_EP_ATTR, 70 provider
//! slots) are asserted below in Rust and, against the generated header, in
//! `tests-c/programs/abi12_check.c`.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod basic;
pub mod codes;
pub mod consts;
pub mod provider;
pub mod structs;

pub use basic::*;
pub use codes::*;
pub use consts::*;
pub use provider::*;
pub use structs::*;
