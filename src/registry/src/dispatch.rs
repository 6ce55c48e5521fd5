//! From a consumer's handle to the provider table that serves it.
//!
//! Non-IA handles are provider objects whose first word is their
//! DAT_PROVIDER pointer. Before jumping through it we make sure the handle
//! can be an object at all (not NULL, not in the low 64 KiB where IA handles
//! and small garbage live, pointer-aligned) and that the word it holds is a
//! table some provider registered. A freed object of a provider that keeps
//! its headers mapped (ours does) is then caught by the provider itself.
//!
//! The checks are the same for both ABIs; `T` is the table type of the
//! library asking (each library's registry holds tables of its ABI only).
//!
//! `provider_of` runs outside the exports' panic boundary (exports.rs,
//! `@body object`): keep it to compares, loads and the registry's
//! non-poisoning lock, nothing that can panic (no indexing, no unwrap, no
//! allocation).

use crate::registry;
use crate::table::{ProviderPtr, ProviderTable};
use dat_abi::DAT_HANDLE;
use std::ffi::c_void;

/// The registered provider table of object handle `h`, or None.
///
/// # Safety
/// `h` is consumer input; it is read only if it passes the checks above.
pub unsafe fn provider_of<T: ProviderTable>(h: DAT_HANDLE) -> Option<&'static T> {
    let v = h as usize;
    if v < registry::IA_HANDLE_LIMIT || !v.is_multiple_of(std::mem::align_of::<*const c_void>()) {
        return None;
    }
    // SAFETY: an aligned address above the IA handle range: a provider
    // object (or, for garbage, memory the consumer handed us as one).
    let table = unsafe { *(h as *const *const c_void) };
    if table.is_null() || !registry::is_registered_table(table) {
        return None;
    }
    // SAFETY: registered, so loaded, and of this library's ABI.
    Some(unsafe { ProviderPtr::new(table.cast::<T>()).table() })
}

/// A handle of any type (for dat_get_handle_type and friends): an open IA
/// handle is mapped to the provider's own IA handle, anything else must be
/// a provider object.
///
/// # Safety
/// As for [`provider_of`].
pub unsafe fn any_handle<T: ProviderTable>(h: DAT_HANDLE) -> Option<(DAT_HANDLE, &'static T)> {
    if let Some(ia) = registry::lookup_ia(h) {
        // SAFETY: the IA is open, so its provider is registered and loaded.
        return Some((ia.provider_ia, unsafe { ia.provider.table() }));
    }
    // SAFETY: the caller's contract.
    unsafe { provider_of(h) }.map(|p| (h, p))
}
