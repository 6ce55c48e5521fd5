//! From a consumer's handle to the provider table that serves it.
//!
//! Non-IA handles are provider objects whose first word is their
//! DAT_PROVIDER pointer. Before jumping through it we make sure the handle
//! can be an object at all (not NULL, not in the low 64 KiB where IA handles
//! and small garbage live, pointer-aligned) and that the word it holds is a
//! table some provider registered. A freed object of a provider that keeps
//! its headers mapped (ours does) is then caught by the provider itself.

use crate::registry::{self, ProviderPtr};
use dat_abi::*;

/// The registered provider table of object handle `h`, or None.
///
/// # Safety
/// `h` is consumer input; it is read only if it passes the checks above.
pub unsafe fn provider_of(h: DAT_HANDLE) -> Option<&'static DAT_PROVIDER> {
    let v = h as usize;
    if v < registry::IA_HANDLE_LIMIT
        || !v.is_multiple_of(std::mem::align_of::<*const DAT_PROVIDER>())
    {
        return None;
    }
    let table = *(h as *const *const DAT_PROVIDER);
    if table.is_null() || !registry::is_registered_table(table) {
        return None;
    }
    Some(ProviderPtr(table).table())
}

/// A handle of any type (for dat_get_handle_type and friends): an open IA
/// handle is mapped to the provider's own IA handle, anything else must be
/// a provider object.
///
/// # Safety
/// As for [`provider_of`].
pub unsafe fn any_handle(h: DAT_HANDLE) -> Option<(DAT_HANDLE, &'static DAT_PROVIDER)> {
    if let Some(ia) = registry::lookup_ia(h) {
        return Some((ia.provider_ia, ia.provider.table()));
    }
    provider_of(h).map(|p| (h, p))
}
