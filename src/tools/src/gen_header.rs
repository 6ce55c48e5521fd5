//! Generates the two cbindgen headers of include/dat2 from the Rust ABI:
//!
//! * `dat_types.h` from src/abi: every type and constant. cbindgen emits
//!   only types reachable from functions, and src/abi has none, so every
//!   `pub struct|union|type` of src/abi is named in `export.include` here,
//!   found by scanning the source: a new type needs no list kept by hand.
//!   Modules in [`OWN_HEADER_MODULES`] have a hand-written header of their
//!   own (`ib_ext.rs` is `<dat2/dat_ib_extensions.h>`): their items are kept
//!   out of `dat_types.h` by naming each in `export.exclude`, again found by
//!   scanning, and tests-c checks them against that header instead.
//! * `dat_api.h` from src/libdat2: the prototypes of the exports.
//!
//! `gen-header` writes both; `gen-header --verify` exits 1 when a committed
//! header differs from what the Rust source generates (`make test` runs it).
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

fn generate(root: &Path, crate_dir: &str, guard: &str, types: bool) -> Result<Vec<u8>, String> {
    let mut config = cbindgen::Config::from_file(root.join("cbindgen.toml"))
        .map_err(|e| format!("cbindgen.toml: {e}"))?;
    config.include_guard = Some(guard.to_string());
    if types {
        let src = root.join("src/abi/src");
        config.export.include = abi_names(&src, &["pub struct ", "pub union ", "pub type "], false);
        // Everything a module with its own header declares, nested modules'
        // items included (cbindgen matches excluded items by name).
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
    } else {
        // The prototypes use the types of dat_types.h, included instead of
        // the system headers.
        config.sys_includes = vec!["dat2/dat_types.h".into()];
        config.export.item_types = vec![cbindgen::ItemType::Functions];
    }
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_crate(root.join(crate_dir))
        .generate()
        .map_err(|e| e.to_string())?;
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
            true,
        ),
        (
            "include/dat2/dat_api.h",
            "src/libdat2",
            "_DAT2_DAT_API_H_",
            false,
        ),
    ];
    let mut ok = true;
    for (path, crate_dir, guard, types) in headers {
        let out = root.join(path);
        let text = match generate(&root, crate_dir, guard, types) {
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
