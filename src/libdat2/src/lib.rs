//! libdat2.so.2: the DAT 2.0 registry, a drop-in for OFED's.
//!
//! It reads dat.conf, loads providers on demand, hands out small-integer IA
//! handles and forwards every other call through the provider table found
//! at the first word of the object handle. It knows nothing of transports.
//!
//! Layout: [`conf`] parses dat.conf; [`registry`] holds the static registry
//! (dat.conf entries and their loaded libraries), the dynamic one (provider
//! tables registered through dat_registry_add_provider) and the IA handle
//! table; [`dispatch`] turns a handle into its provider table, safely;
//! [`exports`] is the C API; [`strerror`] names return codes.

pub mod conf;
pub mod dispatch;
pub mod exports;
pub mod registry;
pub mod strerror;

use dat_abi::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Environment variable that switches on diagnostics (env_logger syntax,
/// e.g. `DAT_LOG=debug` or `DAT_LOG=dat2=trace`).
pub const LOG_ENV: &str = "DAT_LOG";

/// Starts env_logger once, reading [`LOG_ENV`]. Logging stays off when the
/// variable is unset; warnings the user must see go to stderr regardless.
pub(crate) fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let env = env_logger::Env::new()
            .filter(LOG_ENV)
            .write_style("DAT_LOG_STYLE");
        let _ = env_logger::Builder::from_env(env)
            .format_timestamp_micros()
            .try_init();
    });
}

/// Runs one exported call; a Rust panic inside becomes DAT_INTERNAL_ERROR
/// instead of unwinding into C (which would be undefined behaviour).
pub(crate) fn ffi_guard(f: impl FnOnce() -> DAT_RETURN) -> DAT_RETURN {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        log::error!("internal panic caught at the C boundary");
        dat_error(DAT_INTERNAL_ERROR, DAT_NO_SUBTYPE)
    })
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
