//! libdat2.so.2: the DAT 2.0 registry, a drop-in for OFED's.
//!
//! It reads dat.conf, loads providers on demand, hands out small-integer IA
//! handles and forwards every other call through the provider table found
//! at the first word of the object handle. It knows nothing of transports.
//!
//! Layout: the registry itself (dat.conf, static and dynamic registries,
//! IA handle table, handle checks) is the crate dat-registry, shared with
//! libdat.so.1 and re-exported here as [`conf`], [`registry`] and
//! [`dispatch`]; [`exports`] is the DAT 2.0 C API; [`extension`] the
//! open-query extension only 2.0 has; [`strerror`] names return codes.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod exports;
pub mod extension;
pub mod strerror;

pub use dat_registry::{conf, dispatch, registry, LOG_ENV};

use dat_abi::*;

/// This library to the shared registry: named libdat2 in warnings, and
/// numbering codes as the registry makes them (DAT 2.0).
pub(crate) const LIBRARY: registry::Library = registry::Library {
    name: "libdat2",
    own_code: |rc| rc,
    major: None,
};

pub(crate) use dat_registry::init_logging;

/// A code of DAT 2.0's numbering (what the shared `dat_calls!` exports
/// build their codes with; libdat has its 1.2 counterpart).
pub(crate) const fn error(ty: DAT_RETURN_TYPE, sub: DAT_RETURN_SUBTYPE) -> DAT_RETURN {
    dat_error(ty, sub)
}

/// Runs one exported call; a Rust panic inside becomes DAT_INTERNAL_ERROR
/// instead of unwinding into C (which would be undefined behaviour).
pub(crate) fn ffi_guard(f: impl FnOnce() -> DAT_RETURN) -> DAT_RETURN {
    dat_registry::ffi_guard(dat_registry::PANIC_CODE_V20, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_internal_error() {
        let rc = ffi_guard(|| panic!("provoked"));
        assert_eq!(rc, dat_error(DAT_INTERNAL_ERROR, DAT_NO_SUBTYPE));
        assert_eq!(ffi_guard(|| DAT_SUCCESS), DAT_SUCCESS);
    }
}
