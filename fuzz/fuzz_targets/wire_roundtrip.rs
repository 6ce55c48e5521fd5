#![no_main]
// The dat-fuzz target "wire_roundtrip" under libFuzzer (see src/fuzz).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = (dat_fuzz::target("wire_roundtrip")
        .expect("known target")
        .run)(data);
});
