#![no_main]
// The dat-fuzz target "engine_initiator" under libFuzzer (see src/fuzz).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = (dat_fuzz::target("engine_initiator")
        .expect("known target")
        .run)(data);
});
