//! A provider table pointer of either ABI.
//!
//! libdat2.so.2 serves DAT 2.0 tables (`dat_abi::DAT_PROVIDER`),
//! libdat.so.1 DAT 1.2 ones (`dat_abi12::DAT_PROVIDER`, 70 slots).
//! The registry stores either as a [`ProviderPtr`] and itself calls only
//! two slots, `ia_open_func` and `ia_close_func`: they sit at the same
//! offsets with the same signatures in both tables (asserted below), so it
//! reads them through [`ProviderHead`], the prefix both tables share. Every
//! other slot is called by the library that knows the table's ABI, after
//! [`ProviderPtr::table`] gives it back typed.

use dat_abi::{DAT_IA_CLOSE_FUNC, DAT_IA_OPEN_FUNC, DAT_PVOID};
use std::ffi::{c_char, c_void};

/// The DAT_PROVIDER type of one ABI. Implemented for the 2.0 and the 1.2
/// table only: both begin with [`ProviderHead`].
///
/// # Safety
/// An implementor's layout must begin with [`ProviderHead`]'s.
pub unsafe trait ProviderTable: 'static {}

// SAFETY: asserted by the const block below.
unsafe impl ProviderTable for dat_abi::DAT_PROVIDER {}
// SAFETY: asserted by the const block below.
unsafe impl ProviderTable for dat_abi12::DAT_PROVIDER {}

/// The first five slots of a provider table, the same in 1.2 and 2.0:
/// what the registry itself reads. `ia_query_func` differs in type between
/// the versions (its attribute structures do) and is never called here.
#[repr(C)]
pub struct ProviderHead {
    pub device_name: *const c_char,
    pub extension: DAT_PVOID,
    pub ia_open_func: DAT_IA_OPEN_FUNC,
    ia_query_func: *const c_void,
    pub ia_close_func: DAT_IA_CLOSE_FUNC,
}

const _: () = {
    use std::mem::offset_of;
    type V20 = dat_abi::DAT_PROVIDER;
    type V12 = dat_abi12::DAT_PROVIDER;
    assert!(offset_of!(ProviderHead, ia_open_func) == offset_of!(V20, ia_open_func));
    assert!(offset_of!(ProviderHead, ia_open_func) == offset_of!(V12, ia_open_func));
    assert!(offset_of!(ProviderHead, ia_close_func) == offset_of!(V20, ia_close_func));
    assert!(offset_of!(ProviderHead, ia_close_func) == offset_of!(V12, ia_close_func));
    assert!(offset_of!(ProviderHead, device_name) == offset_of!(V12, device_name));
    assert!(offset_of!(ProviderHead, device_name) == offset_of!(V20, device_name));
    assert!(std::mem::size_of::<ProviderHead>() <= std::mem::size_of::<V12>());
};

/// The same slot types in both tables: this compiles only while 1.2's
/// `ia_open_func` and `ia_close_func` have 2.0's (and our head's) types.
#[allow(dead_code)]
fn same_slot_types(v20: &dat_abi::DAT_PROVIDER, v12: &dat_abi12::DAT_PROVIDER) {
    let _: [&DAT_IA_OPEN_FUNC; 2] = [&v20.ia_open_func, &v12.ia_open_func];
    let _: [&DAT_IA_CLOSE_FUNC; 2] = [&v20.ia_close_func, &v12.ia_close_func];
}

/// A registered provider table, of the ABI of the library that registered
/// it. Tables are immutable and live as long as their library stays
/// loaded, which the open counts guarantee.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ProviderPtr(*const c_void);
// SAFETY: the pointee is an immutable table of function pointers.
unsafe impl Send for ProviderPtr {}
// SAFETY: as above.
unsafe impl Sync for ProviderPtr {}

impl ProviderPtr {
    pub fn new<T: ProviderTable>(table: *const T) -> ProviderPtr {
        ProviderPtr(table.cast())
    }

    /// The table's address (for the registered-table check and messages).
    pub fn addr(&self) -> *const c_void {
        self.0
    }

    /// The table, as the ABI `T` of the library that registered it.
    ///
    /// # Safety
    /// The table must still be registered (its library loaded) and be a
    /// `T`: each library registers and reads tables of its own ABI only.
    pub unsafe fn table<T: ProviderTable>(&self) -> &'static T {
        // SAFETY: the caller's contract.
        unsafe { &*self.0.cast::<T>() }
    }

    /// The slots the registry calls, whatever the table's ABI.
    ///
    /// # Safety
    /// The table must still be registered (its library loaded).
    pub(crate) unsafe fn head(&self) -> &'static ProviderHead {
        // SAFETY: every ProviderTable begins with ProviderHead.
        unsafe { &*self.0.cast::<ProviderHead>() }
    }
}
