#![no_main]
// The dat-fuzz target "ud_datagram" under libFuzzer (see src/fuzz).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = (dat_fuzz::target("ud_datagram").expect("known target").run)(data);
});
