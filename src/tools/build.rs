// datinfo links the registry in and loads providers itself: they must find
// dat_registry_add_provider in datinfo, so its symbols are exported; and it
// finds the providers installed beside it (build/lib, $PREFIX/lib).
fn main() {
    println!("cargo:rustc-link-arg-bin=datinfo=-rdynamic");
    println!("cargo:rustc-link-arg-bin=datinfo=-Wl,-rpath,$ORIGIN/../lib");
}
