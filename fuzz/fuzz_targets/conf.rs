#![no_main]
// The dat-fuzz target "conf" under libFuzzer (see src/fuzz).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = (dat_fuzz::target("conf").expect("known target").run)(data);
});
