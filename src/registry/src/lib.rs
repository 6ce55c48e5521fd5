//! The DAT registry, once, for both registry libraries: libdat2.so.2 (DAT
//! 2.0) and libdat.so.1 (DAT 1.2) each link a copy of this crate and put
//! their own C API on top of it.
//!
//! What is here is the same in both ABIs: [`conf`] parses dat.conf;
//! [`api`] is the registry calls of the C API (open, close, add, remove
//! and list providers, strerror);
//! [`registry`] holds the static registry (dat.conf entries and their
//! loaded libraries), the dynamic one (provider tables registered through
//! dat_registry_add_provider) and the IA handle table; [`dispatch`] turns a
//! handle into its provider table, safely; [`exports`] declares the
//! dispatched calls of the C API once for both libraries ([`dat_calls!`]);
//! [`strerror`] names codes by an ABI's tables; [`table`] is the provider
//! table pointer the registry keeps without knowing which ABI's table it
//! is.
//!
//! Codes this crate returns are DAT 2.0 values; libdat.so.1 turns them
//! into 1.2 values at its boundary (`dat_abi12::codes::from_v20`).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod api;
pub mod args;
pub mod conf;
pub mod dispatch;
pub mod exports;
pub mod registry;
pub mod strerror;
pub mod table;

use dat_abi::{dat_error, DAT_INTERNAL_ERROR, DAT_NO_SUBTYPE, DAT_RETURN};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Environment variable that switches on diagnostics (env_logger syntax,
/// e.g. `DAT_LOG=debug` or `DAT_LOG=dat_registry=trace`).
pub const LOG_ENV: &str = "DAT_LOG";

/// Starts env_logger once, reading [`LOG_ENV`]. Logging stays off when the
/// variable is unset; warnings the user must see go to stderr regardless.
pub fn init_logging() {
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

/// DAT_INTERNAL_ERROR in DAT 2.0's numbering, what [`ffi_guard`] returns
/// for a panic unless the caller's ABI numbers it otherwise.
pub const PANIC_CODE_V20: DAT_RETURN = dat_error(DAT_INTERNAL_ERROR, DAT_NO_SUBTYPE);

/// Runs one exported call; a Rust panic inside becomes `on_panic` (the
/// caller's DAT_INTERNAL_ERROR) instead of unwinding into C, which would
/// be undefined behaviour.
pub fn ffi_guard(on_panic: DAT_RETURN, f: impl FnOnce() -> DAT_RETURN) -> DAT_RETURN {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        log::error!("internal panic caught at the C boundary");
        on_panic
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_given_code() {
        assert_eq!(
            ffi_guard(PANIC_CODE_V20, || panic!("provoked")),
            0x8004_0000
        );
        assert_eq!(ffi_guard(7, || panic!("provoked")), 7);
        assert_eq!(ffi_guard(PANIC_CODE_V20, || 0), 0);
    }
}
