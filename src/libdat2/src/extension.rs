//! The open-query extension of DAT 2.0 (`dat_ib_open_query` and
//! `dat_ib_close_query` through `dat_extension_op`): a provider IA opened
//! by IA name outside the IA handle table, holding its provider library
//! loaded like an IA does. DAT 1.2 has no extension op, so this lives here
//! and not in the shared registry, whose static registry it uses.

use dat_abi::*;
use dat_registry::dispatch::provider_of;
use dat_registry::registry::{self, LoadedEntry, ProviderKey, ProviderPtr};
use parking_lot::Mutex;
use std::ffi::c_char;

/// An IA a provider opened for the open-query extension (`dat_ib_open_query`).
struct ExtensionOpen {
    /// The provider's own IA handle, as an address.
    ia: usize,
    /// The provider that opened it. The close calls this table: the first
    /// word of a provider's IA need not be a table it registered (ours
    /// holds a copy naming the IA, for OFED's registry).
    provider: ProviderPtr,
    /// The library entry the open holds loaded.
    lib: Option<LoadedEntry>,
}

static EXTENSION_OPENS: Mutex<Vec<ExtensionOpen>> = Mutex::new(Vec::new());

/// `dat_extension_op` with DAT_OPEN_EXTENSION_BASE in `ext_op`: loads the
/// provider of `key` as dat_ia_openv does and calls its extension slot
/// with the IA name as the handle and the rest of the caller's arguments.
/// On success the library stays loaded until [`close_extension`] of the IA
/// the provider stored in `*ia_out`; on failure a load made here is undone.
///
/// # Safety
/// `name` is a C string; `args` is the caller's va_list after the name,
/// read by the provider; `ia_out` is its next argument (or NULL).
pub unsafe fn open_extension(
    key: &ProviderKey,
    name: *const c_char,
    ext_op: DAT_EXTENDED_OP,
    ia_out: *const DAT_HANDLE,
    args: va_list,
) -> DAT_RETURN {
    let mut reg = registry::lock_static();
    let (provider, lib_entry) = match reg.find_provider(&crate::LIBRARY, key) {
        Ok(found) => found,
        Err(rc) => return rc,
    };
    // SAFETY: the provider is registered and its library loaded.
    let table: &DAT_PROVIDER = unsafe { provider.table() };
    let rc = match table.handle_extendedop_func {
        // SAFETY: the provider reads the caller's arguments; the name is
        // the handle of an open, as in OFED's registry.
        Some(f) => unsafe { f(name as DAT_HANDLE, ext_op, args) },
        None => dat_error(DAT_NOT_IMPLEMENTED, DAT_NO_SUBTYPE),
    };
    if rc != DAT_SUCCESS {
        if let Some(e) = lib_entry {
            reg.unload_if_idle(e);
        }
        return rc;
    }
    if let Some(e) = lib_entry {
        reg.count_open(e);
    }
    let ia = if ia_out.is_null() {
        std::ptr::null_mut()
    } else {
        // SAFETY: the provider just stored its IA there (the open's
        // contract).
        unsafe { *ia_out }
    };
    log::debug!(
        "extension open {:#x} of {}: provider IA {:?}",
        ext_op,
        key.ia_name,
        ia
    );
    EXTENSION_OPENS.lock().push(ExtensionOpen {
        ia: ia as usize,
        provider,
        lib: lib_entry,
    });
    DAT_SUCCESS
}

/// `dat_extension_op` with DAT_CLOSE_EXTENSION_BASE in `ext_op`: `handle`
/// is a provider's own IA from [`open_extension`], closed by the extension
/// slot of the provider that opened it; on success the open's hold on the
/// library is dropped (the last one runs dat_provider_fini and unloads it).
/// Any other handle goes to the provider table at its first word if that
/// is a registered one (as every object call checks), and releases nothing.
///
/// # Safety
/// `handle` is consumer input, read only as described; `args` is the
/// caller's va_list.
pub unsafe fn close_extension(
    handle: DAT_HANDLE,
    ext_op: DAT_EXTENDED_OP,
    args: va_list,
) -> DAT_RETURN {
    let mut reg = registry::lock_static();
    let opened = EXTENSION_OPENS
        .lock()
        .iter()
        .find(|o| !handle.is_null() && o.ia == handle as usize)
        .map(|o| o.provider);
    let table: &DAT_PROVIDER = match opened {
        // SAFETY: the open holds this provider's library loaded.
        Some(p) => unsafe { p.table() },
        // SAFETY: provider_of reads the handle only once it may be an object.
        None => match unsafe { provider_of(handle) } {
            Some(t) => t,
            None => return dat_error(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA),
        },
    };
    let rc = match table.handle_extendedop_func {
        // SAFETY: the provider's own IA (or object), its own call.
        Some(f) => unsafe { f(handle, ext_op, args) },
        None => dat_error(DAT_NOT_IMPLEMENTED, DAT_NO_SUBTYPE),
    };
    if rc == DAT_SUCCESS {
        let mut opens = EXTENSION_OPENS.lock();
        if let Some(i) = opens.iter().position(|o| o.ia == handle as usize) {
            let lib_entry = opens.remove(i).lib;
            drop(opens);
            if let Some(e) = lib_entry {
                reg.release(e);
            }
        }
    }
    rc
}
