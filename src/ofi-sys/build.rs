//! Generates the libfabric bindings from the installed headers
//! (Debian: libfabric-dev). libfabric.so.1 is not linked: src/lib.rs opens
//! it at first use (see there why).

use std::env;
use std::path::PathBuf;

fn main() {
    let lib = pkg_config::Config::new()
        .atleast_version("1.17")
        .cargo_metadata(false)
        .probe("libfabric")
        .unwrap_or_else(|e| panic!("libfabric >= 1.17 not found (install libfabric-dev): {e}"));
    let includes = lib
        .include_paths
        .iter()
        .map(|p| format!("-I{}", p.display()));
    println!("cargo:rerun-if-changed=wrapper.h");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(includes)
        .allowlist_type("fi_.*")
        .allowlist_type("fid.*")
        .allowlist_var("FI_.*")
        .allowlist_var("FABRIC_.*")
        // Plain integers: the flag words are OR-ed together.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .derive_default(true)
        .size_t_is_usize(true)
        .layout_tests(false)
        .generate()
        .expect("bindgen could not read the libfabric headers");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings
        .write_to_file(out)
        .expect("cannot write bindings.rs");
}
