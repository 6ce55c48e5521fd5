//! The bounded fuzz run of `make test` (through `cargo test --workspace`): every target replays
//! its seeds, corpus and saved regressions, then mutates for a short, fixed budget
//! (DAT_FUZZ_MS milliseconds a target, default 2000 for the parsers and 3000 for the engine;
//! at most DAT_FUZZ_MAX inputs). Seeded (DAT_FUZZ_SEED, default 1): the inputs are the same
//! from run to run, only how many fit in the budget depends on the machine.

use std::time::Duration;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn bounded(name: &str) {
    let t = dat_fuzz::target(name).expect("target");
    let ms = env_u64("DAT_FUZZ_MS").unwrap_or(if t.slow { 3000 } else { 2000 });
    let max = env_u64("DAT_FUZZ_MAX").unwrap_or(u64::MAX);
    let seed = env_u64("DAT_FUZZ_SEED").unwrap_or(1);
    match dat_fuzz::fuzz(t, seed, Duration::from_millis(ms), max, false) {
        Ok(s) => eprintln!(
            "fuzz {name}: {} inputs + {} replayed in {:.1}s, {} outcome classes",
            s.inputs,
            s.replayed,
            s.elapsed.as_secs_f64(),
            s.classes
        ),
        Err(c) => panic!(
            "fuzz {name}: {} (input saved to {:?}; it is replayed from now on)",
            c.message, c.saved
        ),
    }
}

#[test]
fn fuzz_conf() {
    bounded("conf");
}
#[test]
fn fuzz_ia_params() {
    bounded("ia_params");
}
#[test]
fn fuzz_wire_header() {
    bounded("wire_header");
}
#[test]
fn fuzz_wire_stream() {
    bounded("wire_stream");
}
#[test]
fn fuzz_wire_roundtrip() {
    bounded("wire_roundtrip");
}
#[test]
fn fuzz_ud_datagram() {
    bounded("ud_datagram");
}
#[test]
fn fuzz_engine_target() {
    bounded("engine_target");
}
#[test]
fn fuzz_engine_datagram() {
    bounded("engine_datagram");
}
#[test]
fn fuzz_engine_initiator() {
    bounded("engine_initiator");
}

/// Every target is exercised above, and no target is missing from this file.
#[test]
fn every_target_has_a_bounded_run() {
    let src = include_str!("bounded.rs");
    for t in dat_fuzz::TARGETS {
        assert!(
            src.contains(&format!("bounded(\"{}\")", t.name)),
            "{}",
            t.name
        );
    }
}

/// The checks themselves catch what they are for: a panic, and an allocation sized by a
/// length field.
#[test]
fn the_fuzzer_catches_panics_and_allocations_from_length_fields() {
    fn trusting(data: &[u8]) -> u64 {
        let mut n = [0u8; 4];
        n.copy_from_slice(&data[..4]);
        let v: Vec<u8> = Vec::with_capacity(u32::from_le_bytes(n) as usize);
        v.capacity() as u64
    }
    let t = dat_fuzz::Target {
        name: "selftest",
        run: trusting,
        max_len: 16,
        dict: &[],
        framed: false,
        slow: false,
    };
    assert!(dat_fuzz::run_one(&t, &16u32.to_le_bytes()).is_ok());
    let e = dat_fuzz::run_one(&t, &(1u32 << 30).to_le_bytes()).expect_err("caught");
    assert!(e.contains("allocation"), "{e}");
    let e = dat_fuzz::run_one(&t, &[1]).expect_err("caught");
    assert!(e.contains("range"), "{e}");
}
