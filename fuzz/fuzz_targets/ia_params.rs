#![no_main]
// The dat-fuzz target "ia_params" under libFuzzer (see src/fuzz).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = (dat_fuzz::target("ia_params").expect("known target").run)(data);
});
