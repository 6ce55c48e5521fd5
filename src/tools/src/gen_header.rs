//! Generates the cbindgen headers of include/dat2 and include/dat from the
//! Rust ABI:
//!
//! * `dat_types.h` from src/abi: every type and constant. cbindgen emits
//!   only types reachable from functions, and src/abi has none, so every
//!   `pub struct|union|type` of src/abi is named in `export.include` here,
//!   found by scanning the source: a new type needs no list kept by hand.
//!   Modules in [`OWN_HEADER_MODULES`] have a hand-written header of their
//!   own (`ib_ext.rs` is `<dat2/dat_ib_extensions.h>`): their items are kept
//!   out of `dat_types.h` by naming each in `export.exclude`, again found by
//!   scanning, and tests-c checks them against that header instead.
//! * `dat_api.h` from src/libdat2: the prototypes of the exports. Those
//!   of the dispatched calls come from dat-registry's `dat_calls!` list,
//!   which the exports are generated from and cbindgen (which does not
//!   expand macros) cannot read in place: `dat_calls!(v20, prototypes)`
//!   gives them as Rust source, written to a scratch file that cbindgen
//!   reads before the crate, so they come first, in the list's order, and
//!   the registry calls written out in src/libdat2 follow.
//! * `include/dat/dat_types.h` from src/abi12, the DAT 1.2 ABI, found the
//!   same way. What 1.2 shares with 2.0 src/abi12 re-exports from dat-abi
//!   (`pub use dat_abi::...`) instead of repeating it, so cbindgen also
//!   reads dat-abi here (its types only: cbindgen emits the constants of
//!   the crate it generates for), and the re-exported names are named in
//!   `export.include` too. cbindgen reads src/abi12 first, so where both
//!   crates declare a name, 1.2's declaration is the one emitted.
//! * `include/dat/dat_api.h` from src/libdat: the prototypes of libdat.so.1's
//!   exports, over the 1.2 types; the dispatched ones from
//!   `dat_calls!(v12, prototypes)`, as for 2.0.
//!
//! `gen-header` writes all four; `gen-header --verify` exits 1 when a
//! committed header differs from what the Rust source generates (`make
//! test` runs it).
#![deny(unsafe_op_in_unsafe_fn)]
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Files of src/abi/src whose items are not part of `dat_types.h`: each is
/// the Rust side of a hand-written header (ib_ext.rs: the IB extensions,
/// `<dat2/dat_ib_extensions.h>`, which C programs include on their own).
const OWN_HEADER_MODULES: &[&str] = &["ib_ext.rs"];

/// The names declared with one of `keywords` (e.g. "pub struct ") in the
/// .rs files of `src_dir`, those of [`OWN_HEADER_MODULES`] (`own` = true)
/// or the others (`own` = false).
fn abi_names(src_dir: &Path, keywords: &[&str], own: bool) -> Vec<String> {
    let mut names = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(src_dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for file in files {
        let is_own = file
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| OWN_HEADER_MODULES.contains(&n));
        if is_own != own {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for line in text.lines() {
            let line = line.trim_start();
            for kw in keywords {
                if let Some(rest) = line.strip_prefix(kw) {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        names.push(name);
                    }
                }
            }
        }
    }
    names
}

/// The names the `pub use dat_abi::...;` statements of the .rs files of
/// `src_dir` re-export: the last segment of each path, `{a, b}` lists and
/// statements over several lines included.
fn reexported_names(src_dir: &Path) -> Vec<String> {
    const USE: &str = "pub use dat_abi::";
    let mut names = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(src_dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let mut rest = text.as_str();
        while let Some(at) = rest.find(USE) {
            let stmt = &rest[at + USE.len()..];
            let end = stmt.find(';').unwrap_or(stmt.len());
            let list = match (stmt[..end].find('{'), stmt[..end].rfind('}')) {
                (Some(open), Some(close)) => &stmt[open + 1..close],
                _ => &stmt[..end],
            };
            for path in list.split(',') {
                let name = path.trim().rsplit("::").next().unwrap_or("").trim();
                if !name.is_empty() && name != "*" && name != "self" {
                    names.push(name.to_string());
                }
            }
            rest = &stmt[end..];
        }
    }
    names
}

/// What a header is generated from.
#[derive(Clone, Copy)]
enum Kind {
    /// src/abi: the DAT 2.0 types and constants.
    Types20,
    /// src/libdat2: the DAT 2.0 prototypes.
    Api20,
    /// src/abi12, with the dat-abi items it re-exports: the DAT 1.2 types
    /// and constants.
    Types12,
    /// src/libdat: the DAT 1.2 prototypes.
    Api12,
}

fn generate(root: &Path, crate_dir: &str, guard: &str, kind: Kind) -> Result<Vec<u8>, String> {
    let mut config = cbindgen::Config::from_file(root.join("cbindgen.toml"))
        .map_err(|e| format!("cbindgen.toml: {e}"))?;
    config.include_guard = Some(guard.to_string());
    let type_keywords = ["pub struct ", "pub union ", "pub type "];
    match kind {
        Kind::Types20 => {
            let src = root.join("src/abi/src");
            config.export.include = abi_names(&src, &type_keywords, false);
            // Everything a module with its own header declares, nested
            // modules' items included (cbindgen matches excluded items by
            // name).
            config.export.exclude.extend(abi_names(
                &src,
                &[
                    "pub struct ",
                    "pub union ",
                    "pub type ",
                    "pub const ",
                    "pub static ",
                    "pub enum ",
                    "pub fn ",
                ],
                true,
            ));
        }
        Kind::Api20 => {
            // The prototypes use the types of dat_types.h, included instead
            // of the system headers.
            config.sys_includes = vec!["dat2/dat_types.h".into()];
            config.export.item_types = vec![cbindgen::ItemType::Functions];
        }
        Kind::Api12 => {
            config.sys_includes = vec!["dat/dat_types.h".into()];
            config.export.item_types = vec![cbindgen::ItemType::Functions];
            config.autogen_warning = Some(
                "/*\n * Generated by cbindgen from libdat.so.1's exports, src/libdat (`make header`).\n \
                 * Do not edit: change the Rust source and regenerate. Include <dat/udat.h>;\n \
                 * dat_ia_open is a macro over dat_ia_openv (dat.h).\n */"
                    .into(),
            );
        }
        Kind::Types12 => {
            let src = root.join("src/abi12/src");
            config.export.include = abi_names(&src, &type_keywords, false);
            config.export.include.extend(reexported_names(&src));
            // dat-abi is read for the definitions src/abi12 re-exports; the
            // names src/abi12 declares itself shadow dat-abi's (cbindgen
            // parses the binding crate first and keeps the first item of a
            // name), and dat-abi's constants are not emitted.
            config.parse.parse_deps = true;
            config.parse.include = Some(vec!["dat-abi".into()]);
            config.autogen_warning = Some(
                "/*\n * Generated by cbindgen from the Rust ABI of DAT 1.2 (`make header`).\n \
                 * Do not edit: change src/abi12 and regenerate. Include <dat/udat.h>.\n */"
                    .into(),
            );
        }
    }
    let mut builder = cbindgen::Builder::new()
        .with_config(config)
        .with_crate(root.join(crate_dir));
    // The dispatched calls' prototypes (see the module documentation).
    let prototypes: Option<(&str, &[&str])> = match kind {
        Kind::Api20 => Some(("dat_calls_v20", dat_registry::dat_calls!(v20, prototypes))),
        Kind::Api12 => Some(("dat_calls_v12", dat_registry::dat_calls!(v12, prototypes))),
        Kind::Types20 | Kind::Types12 => None,
    };
    let scratch = match prototypes {
        Some((stem, list)) => {
            let file = std::env::temp_dir().join(format!("{stem}-{}.rs", std::process::id()));
            let text: String = list
                .iter()
                .filter(|p| !p.is_empty())
                .map(|p| format!("{p}\n"))
                .collect();
            std::fs::write(&file, text).map_err(|e| format!("{}: {e}", file.display()))?;
            builder = builder.with_src(&file);
            Some(file)
        }
        None => None,
    };
    let bindings = builder.generate().map_err(|e| e.to_string());
    if let Some(file) = scratch {
        let _ = std::fs::remove_file(file);
    }
    let bindings = bindings?;
    let mut text = Vec::new();
    bindings.write(&mut text);
    Ok(text)
}

fn main() -> ExitCode {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let verify = std::env::args().any(|a| a == "--verify");
    let headers = [
        (
            "include/dat2/dat_types.h",
            "src/abi",
            "_DAT2_DAT_TYPES_H_",
            Kind::Types20,
        ),
        (
            "include/dat2/dat_api.h",
            "src/libdat2",
            "_DAT2_DAT_API_H_",
            Kind::Api20,
        ),
        (
            "include/dat/dat_types.h",
            "src/abi12",
            "_DAT_DAT_TYPES_H_",
            Kind::Types12,
        ),
        (
            "include/dat/dat_api.h",
            "src/libdat",
            "_DAT_DAT_API_H_",
            Kind::Api12,
        ),
    ];
    let mut ok = true;
    for (path, crate_dir, guard, kind) in headers {
        let out = root.join(path);
        let text = match generate(&root, crate_dir, guard, kind) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("gen-header: {path}: {e}");
                return ExitCode::FAILURE;
            }
        };
        if verify {
            if std::fs::read(&out).ok().as_deref() == Some(&text[..]) {
                println!("gen-header: {path} matches the Rust ABI");
            } else {
                eprintln!("gen-header: {path} differs from the Rust ABI: run `make header`");
                ok = false;
            }
        } else if let Err(e) = std::fs::write(&out, &text) {
            eprintln!("gen-header: {path}: {e}");
            return ExitCode::FAILURE;
        } else {
            println!("gen-header: wrote {path}");
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
