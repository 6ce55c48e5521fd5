//! The C argument lists of the registry's own calls (those no provider
//! serves), stated once: a refused argument is named, and its
//! DAT_INVALID_ARGn comes from its position here. (The calls a provider
//! serves are declared in `exports::dat_calls!`; the provider places its
//! own refusals by its lists, `daplrs-ffi`'s `calls`.)

use dat_abi::*;

/// One registry call: its DAT name and its parameters in C order.
pub struct RegistryCall {
    pub name: &'static str,
    pub params: &'static [&'static str],
}

impl RegistryCall {
    /// DAT_INVALID_PARAMETER with DAT_INVALID_ARGn for `param` (a 2.0
    /// code). A name the call does not have is a bug of ours: a debug
    /// build stops on it (the unit tests run every refusal), a release
    /// build returns DAT_INTERNAL_ERROR rather than some ARGn.
    pub fn bad(&self, param: &str) -> DAT_RETURN {
        match self.params.iter().position(|p| *p == param) {
            Some(i) if i < 10 => dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1 + i as u32),
            _ => {
                debug_assert!(false, "{}: no argument `{param}`", self.name);
                log::error!("{}: no argument `{param}`", self.name);
                dat_error(DAT_INTERNAL_ERROR, DAT_NO_SUBTYPE)
            }
        }
    }
}

/// Declares each call as a constant `RegistryCall`, and `ALL`.
macro_rules! registry_calls {
    ($($konst:ident = $name:ident($($param:ident),* $(,)?);)*) => {
        $(
            pub const $konst: RegistryCall = RegistryCall {
                name: stringify!($name),
                params: &[$(stringify!($param)),*],
            };
        )*
        #[cfg(test)]
        const ALL: &[&RegistryCall] = &[$(&$konst),*];
    };
}

registry_calls! {
    IA_OPENV = dat_ia_openv(
        name, async_event_qlen, async_event_handle, ia_handle, dapl_major, dapl_minor,
        thread_safety,
    );
    REGISTRY_ADD_PROVIDER = dat_registry_add_provider(provider, provider_info);
    REGISTRY_REMOVE_PROVIDER = dat_registry_remove_provider(provider, provider_info);
    REGISTRY_LIST_PROVIDERS = dat_registry_list_providers(
        max_to_return, entries_returned, dat_provider_list
    );
    REGISTRY_PROVIDERS_RELATED = dat_registry_providers_related(provider1, provider2, answer);
    STRERROR = dat_strerror(value, major_message, minor_message);
    DATS_GET_IA_HANDLE = dats_get_ia_handle(handle, ia_handle_p);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parameter names of `name`'s prototype in a generated header.
    fn prototype(header: &str, name: &str) -> Option<Vec<String>> {
        let path = format!("{}/../../{header}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(path).expect("header");
        let at = text.find(&format!("DAT_RETURN {name}("))?;
        let args = &text[at..];
        let args = &args[args.find('(')? + 1..args.find(')')?];
        Some(
            args.split(',')
                .filter_map(|a| {
                    a.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .rfind(|w| !w.is_empty())
                        .map(str::to_string)
                })
                .collect(),
        )
    }

    #[test]
    fn every_call_matches_its_dat2_prototype() {
        for call in ALL {
            let theirs = prototype("include/dat2/dat_api.h", call.name)
                .unwrap_or_else(|| panic!("{} not in dat_api.h", call.name));
            assert_eq!(call.params, theirs, "{}", call.name);
        }
    }

    /// 1.2 declares the same calls (those it has) with the same positions.
    #[test]
    fn dat12_prototypes_have_the_same_arity() {
        for call in ALL {
            if let Some(theirs) = prototype("include/dat/dat_api.h", call.name) {
                assert_eq!(call.params.len(), theirs.len(), "{}", call.name);
            }
        }
    }

    #[test]
    fn a_named_argument_is_placed() {
        assert_eq!(
            REGISTRY_LIST_PROVIDERS.bad("dat_provider_list"),
            dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3)
        );
    }
}
