//! Names of DAT_RETURN types and subtypes as static C strings, for
//! dat_strerror. Each library names codes by its own ABI's tables (1.2 and
//! 2.0 number several types and subtypes differently).

use dat_abi::{dat_get_subtype, dat_get_type, DAT_RETURN, DAT_RETURN_TYPE};
use std::ffi::{CStr, CString};
use std::sync::OnceLock;

/// The names of one ABI's codes, made C strings on first use.
pub struct ReturnNames {
    types: &'static [(DAT_RETURN_TYPE, &'static str)],
    subtypes: &'static [&'static str],
    c_strings: OnceLock<CNames>,
}

struct CNames {
    types: Vec<(DAT_RETURN_TYPE, CString)>,
    subtypes: Vec<CString>,
}

impl ReturnNames {
    /// `types`: every type value with its name; `subtypes`: the subtype
    /// names indexed by value.
    pub const fn new(
        types: &'static [(DAT_RETURN_TYPE, &'static str)],
        subtypes: &'static [&'static str],
    ) -> ReturnNames {
        ReturnNames {
            types,
            subtypes,
            c_strings: OnceLock::new(),
        }
    }

    fn c_strings(&self) -> &CNames {
        self.c_strings.get_or_init(|| CNames {
            types: self
                .types
                .iter()
                .map(|&(v, n)| (v, CString::new(n).unwrap()))
                .collect(),
            subtypes: self
                .subtypes
                .iter()
                .map(|&n| CString::new(n).unwrap())
                .collect(),
        })
    }

    /// `(type name, subtype name)` of `value`, or None when either part is
    /// not a code of this ABI. The class bits (error, warning) do not
    /// change the names; type and subtype masks are the same in 1.2 and
    /// 2.0.
    pub fn names(&self, value: DAT_RETURN) -> Option<(&CStr, &CStr)> {
        let t = self.c_strings();
        let ty = dat_get_type(value);
        let sub = dat_get_subtype(value) as usize;
        let major = t
            .types
            .iter()
            .find(|(v, _)| *v == ty)
            .map(|(_, n)| n.as_c_str())?;
        let minor = t.subtypes.get(sub)?.as_c_str();
        Some((major, minor))
    }
}
