//! libdat.so.1: the DAT 1.2 registry and API (`<dat/udat.h>`, `-ldat`).
//!
//! The registry is the one libdat2.so.2 uses (crate dat-registry): the same
//! dat.conf, served here for its `u1.2` entries, the same small-integer IA
//! handles and the same handle checks. What is 1.2's own is the C API in
//! [`exports`]: 1.2 signatures (7-argument dat_rmr_bind, 11-argument
//! dat_lmr_create, 1-argument dat_cr_reject), dispatch through the 70-slot
//! 1.2 provider table, and 1.2 return codes. Codes this library makes are
//! 1.2 values; those of the shared registry are 2.0 values turned into
//! 1.2's by `dat_abi12::codes::from_v20`; a provider's pass through as the
//! provider returned them (a 1.2 provider returns 1.2 codes).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod exports;

use dat_abi12::*;

/// This library to the shared registry: named libdat in warnings, and
/// turning the codes the registry makes (2.0 values) into 1.2's.
const LIBRARY: dat_registry::registry::Library = dat_registry::registry::Library {
    name: "libdat",
    own_code: dat_abi12::codes::from_v20,
    major: Some(DAT_VERSION_MAJOR),
};

/// An error code of 1.2's numbering. The composition (class | type |
/// subtype) is the same in both versions; the values passed are 1.2's.
const fn error(ty: DAT_RETURN_TYPE, sub: DAT_RETURN_SUBTYPE) -> DAT_RETURN {
    dat_abi::dat_error(ty, sub)
}

/// Runs one exported call; a Rust panic inside becomes 1.2's
/// DAT_INTERNAL_ERROR instead of unwinding into C.
fn ffi_guard(f: impl FnOnce() -> DAT_RETURN) -> DAT_RETURN {
    dat_registry::ffi_guard(error(DAT_INTERNAL_ERROR, DAT_NO_SUBTYPE), f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_internal_error() {
        assert_eq!(ffi_guard(|| panic!("provoked")), 0x8004_0000);
        assert_eq!(ffi_guard(|| DAT_SUCCESS), DAT_SUCCESS);
    }
}
