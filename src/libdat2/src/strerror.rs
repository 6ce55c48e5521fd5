//! Names of DAT_RETURN types and subtypes, as static C strings.

use dat_abi::*;
use dat_registry::strerror::ReturnNames;
use std::ffi::CStr;

/// DAT 2.0's code names (dat_strerror's).
pub static NAMES: ReturnNames = ReturnNames::new(DAT_RETURN_TYPE_NAMES, DAT_RETURN_SUBTYPE_NAMES);

/// `(type name, subtype name)` of `value`, or None when either part is not
/// a code the DAT 2.0 headers define. The class bits (error, warning) do
/// not change the names.
pub fn names(value: DAT_RETURN) -> Option<(&'static CStr, &'static CStr)> {
    NAMES.names(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_every_type_and_subtype() {
        assert_eq!(
            names(0x8005000c).unwrap(),
            (c"DAT_INVALID_HANDLE", c"DAT_INVALID_HANDLE_EP")
        );
        assert_eq!(
            names(0x800a0064).unwrap(),
            (c"DAT_PROVIDER_NOT_FOUND", c"DAT_NAME_NOT_REGISTERED")
        );
        assert_eq!(
            names(DAT_SUCCESS).unwrap(),
            (c"DAT_SUCCESS", c"DAT_NO_SUBTYPE")
        );
        assert_eq!(
            names(DAT_NOT_IMPLEMENTED).unwrap().0,
            c"DAT_NOT_IMPLEMENTED"
        );
        for &(ty, _) in DAT_RETURN_TYPE_NAMES {
            for sub in 0..DAT_RETURN_SUBTYPE_NAMES.len() as u32 {
                assert!(names(DAT_CLASS_ERROR | ty | sub).is_some());
            }
        }
        assert!(names(0x0abc0000).is_none());
        assert!(names(DAT_CLASS_ERROR | DAT_ABORT | 0x7777).is_none());
    }
}
