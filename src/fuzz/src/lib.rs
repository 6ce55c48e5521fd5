//! A small mutation fuzzer that runs on stable Rust, for every parser that reads outside input:
//! the dat.conf parser, ia_params, the rs-tcp wire protocol (header, stream decoder,
//! encode/decode round trip, datagram header) and the engine behind it from both ends: the
//! harnesses are here ([`wire`], [`engine`], [`datagram`]); the provider (`daplrs`, built with its
//! `fuzzing` feature, which the shipped libraries never enable) only makes public what they need
//! (`backend::tcp::wire`, `daplrs::fuzzing`).
//!
//! No coverage instrumentation (stable Rust has none a library can read): inputs are mutated
//! from a seed pool (built-in seeds made by our own encoder, `fuzz/corpus/<target>/`,
//! `fuzz/regressions/<target>/`) with byte-level and structure-aware mutations (header fields
//! set to boundary values, dictionary words spliced in), and an input whose outcome class (a
//! hash of what the parser decided, returned by each target) was not seen before joins the
//! pool. Seeded and deterministic: the same seed gives the same inputs.
//!
//! A panic anywhere (the harness's own thread or the provider's progress thread) is a crash:
//! the input is written to `fuzz/regressions/<target>/` and replayed by `cargo test` from then
//! on. Coverage-guided runs (libFuzzer through cargo-fuzz, nightly only) use the same entry
//! points and corpus: `make fuzz`.
#![deny(unsafe_op_in_unsafe_fn)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

pub mod datagram;
pub mod engine;
pub mod seeds;
pub mod wire;

use datagram::EngineDatagram;
use engine::{EngineInitiator, EngineTarget};

/// An outcome class: a hash of what the parser decided.
pub(crate) fn class_of(x: impl std::hash::Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    x.hash(&mut h);
    std::hash::Hasher::finish(&h)
}

/// One fuzz target: an entry point over bytes and what its inputs look like.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]) -> u64,
    /// Longest input generated.
    pub max_len: usize,
    /// Words the mutator splices in.
    pub dict: &'static [&'static [u8]],
    /// Inputs are streams of 32-byte wire headers (plus payloads): mutate header fields too.
    pub framed: bool,
    /// Inputs the property check costs milliseconds (a connection each): budgets differ.
    pub slow: bool,
}

/// The dat.conf parser: no panic; what it accepts re-serializes to a line that parses to the
/// same entry; one entry or error per line at most.
pub fn conf(data: &[u8]) -> u64 {
    use dat_registry::conf::{parse, parse_bytes, ConfEntry};
    // As the registry reads a file: bytes, whatever they are.
    let (entries, errors) = parse_bytes(data, "fuzz");
    assert!(entries.len() + errors.len() <= data.split(|&b| b == b'\n').count());
    let field = |s: &str| {
        if s.is_empty() || s.contains(|c: char| c.is_whitespace() || c == '#') {
            assert!(!s.contains('"'), "a quoted field kept a quote: {s:?}");
            format!("\"{s}\"")
        } else {
            s.to_string()
        }
    };
    let line = |e: &ConfEntry| {
        format!(
            "{} {} {} {} {} {}",
            field(&e.ia_name),
            e.api_fields(),
            field(&e.library),
            field(&format!(
                "{}.{}.{}",
                e.provider_id, e.provider_major, e.provider_minor
            )),
            field(&e.ia_params),
            field(&e.platform_params)
        )
    };
    for e in &entries {
        assert!(e.ia_name.len() < dat_abi::DAT_NAME_MAX_LENGTH);
        let l = line(e);
        let (again, err) = parse(&l, "fuzz");
        assert!(
            err.is_empty(),
            "re-serialized entry refused: {l:?}: {err:?}"
        );
        assert_eq!(again.len(), 1, "{l:?}");
        let mut want = e.clone();
        want.origin = "fuzz:1".into();
        assert_eq!(again[0], want, "entry did not round-trip through {l:?}");
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(
        &(
            entries.len().min(4),
            errors
                .iter()
                .map(|e| {
                    let mut r = e.reason.split(|c: char| c == '\'' || c.is_ascii_digit());
                    r.next().unwrap_or("").to_string()
                })
                .collect::<Vec<_>>(),
        ),
        &mut h,
    );
    std::hash::Hasher::finish(&h)
}

/// The dat.conf `ia_params` of an entry ("tcp lo", "tcp 127.0.0.1", "verbs rxe0 1", ...):
/// split into words and diagnosed (what datinfo and a failing dat_ia_open report: resolving
/// the address, listing the interfaces). No panic, and every word comes from the input.
pub fn ia_params(data: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(data);
    let (transport, target, port) = daplrs::fuzzing::parse_ia_params(&text);
    for w in [transport, target].into_iter().chain(port) {
        assert!(
            w == "tcp" || w == "lo" || text.split_whitespace().any(|x| x == w),
            "word '{w}' not from the input"
        );
    }
    let verdict = daplrs::device::diagnose(&text);
    class_of((transport.len().min(8), port.is_some(), verdict.is_none()))
}

static ENGINE_TARGET: Mutex<Option<EngineTarget>> = Mutex::new(None);
static ENGINE_DATAGRAM: Mutex<Option<EngineDatagram>> = Mutex::new(None);
static ENGINE_INITIATOR: Mutex<Option<EngineInitiator>> = Mutex::new(None);

/// The engine as a target (see [`EngineTarget`]); one IA for the process.
pub fn engine_target(data: &[u8]) -> u64 {
    let mut g = ENGINE_TARGET.lock().unwrap_or_else(|p| p.into_inner());
    g.get_or_insert_with(EngineTarget::new).run(data)
}

/// Datagram QPs under strangers' datagrams (see [`EngineDatagram`]).
pub fn engine_datagram(data: &[u8]) -> u64 {
    let mut g = ENGINE_DATAGRAM.lock().unwrap_or_else(|p| p.into_inner());
    g.get_or_insert_with(EngineDatagram::new).run(data)
}

/// The engine as an initiator (see [`EngineInitiator`]).
pub fn engine_initiator(data: &[u8]) -> u64 {
    let mut g = ENGINE_INITIATOR.lock().unwrap_or_else(|p| p.into_inner());
    g.get_or_insert_with(EngineInitiator::new).run(data)
}

const CONF_DICT: &[&[u8]] = &[
    b" ",
    b"\t",
    b"\n",
    b"\r\n",
    b"\"",
    b"\"\"",
    b"#",
    b"u2.0",
    b"u1.2",
    b"k2.0",
    b"u4294967296.0",
    b"threadsafe",
    b"nonthreadsafe",
    b"default",
    b"nondefault",
    b"libdaplrs.so.2",
    b"dapl.2.0",
    b".",
    b"\"tcp lo\"",
    b"\0",
    "\u{feff}".as_bytes(),
    "\u{a0}".as_bytes(),
    b"\xff",
];
const PARAMS_DICT: &[&[u8]] = &[
    b"tcp",
    b"verbs",
    b"lo",
    b" ",
    b"\t",
    b"127.0.0.1",
    b"0.0.0.0",
    b"255.255.255.255",
    b"192.0.2.1",
    b"rxe0",
    b"1",
    b"256",
    b"eth0",
    b"\0",
    b"%",
    b"/",
    b"..",
];
const WIRE_DICT: &[&[u8]] = &[b"DAPLRS\0\0", b"DAUD\x01", b"\x01\0\0\0"];

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    Target {
        name: "conf",
        run: conf,
        max_len: 4096,
        dict: CONF_DICT,
        framed: false,
        slow: false,
    },
    Target {
        name: "ia_params",
        run: ia_params,
        max_len: 256,
        dict: PARAMS_DICT,
        framed: false,
        slow: false,
    },
    Target {
        name: "wire_header",
        run: wire::wire_header,
        max_len: 32,
        dict: WIRE_DICT,
        framed: true,
        slow: false,
    },
    Target {
        name: "wire_stream",
        run: wire::wire_stream,
        max_len: 8192,
        dict: WIRE_DICT,
        framed: false,
        slow: false,
    },
    Target {
        name: "wire_roundtrip",
        run: wire::wire_roundtrip,
        max_len: 4096,
        dict: WIRE_DICT,
        framed: false,
        slow: false,
    },
    Target {
        name: "ud_datagram",
        run: wire::ud_datagram,
        max_len: 256,
        dict: WIRE_DICT,
        framed: false,
        slow: false,
    },
    Target {
        name: "engine_target",
        run: engine_target,
        max_len: 4096,
        dict: WIRE_DICT,
        framed: true,
        slow: true,
    },
    Target {
        name: "engine_initiator",
        run: engine_initiator,
        max_len: 72 << 10,
        dict: WIRE_DICT,
        framed: true,
        slow: true,
    },
    Target {
        name: "engine_datagram",
        run: engine_datagram,
        max_len: 8192,
        dict: WIRE_DICT,
        framed: false,
        slow: true,
    },
];

pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The repository's fuzz/ directory (corpus, regressions).
pub fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of a directory, sorted by name (missing: none).
pub fn read_dir_inputs(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_file())
        .filter_map(|e| std::fs::read(e.path()).ok().map(|d| (e.path(), d)))
        .collect();
    out.sort();
    out
}

/// splitmix64: small, seeded, deterministic.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

/// Values at the edges of what the parsers check.
const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    7,
    8,
    15,
    16,
    17,
    31,
    32,
    33,
    63,
    64,
    255,
    256,
    1023,
    1024,
    1025,
    2048,
    3071,
    3072,
    4095,
    4096,
    0x7fff,
    0xffff,
    0x1_0000,
    (16 << 20) - 1,
    16 << 20,
    (16 << 20) + 1,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
    0xfeed_0001,
    0x1_0000_0000,
    u64::MAX,
    u64::MAX - 1,
    0x0000_5352_4c50_4144,
];

/// One mutation of `input` (possibly several stacked), within `t.max_len`.
pub fn mutate(rng: &mut Rng, t: &Target, input: &[u8], pool: &[Vec<u8>]) -> Vec<u8> {
    if t.slow && rng.below(2) == 0 {
        // Keep the handshake frame whole half of the time: what follows it is reached.
        let end = frame_starts(input, false)
            .get(1)
            .copied()
            .unwrap_or(input.len());
        let mut head = input[..end].to_vec();
        let tail = mutate_bytes(rng, t, &input[end..], pool);
        head.extend_from_slice(&tail);
        head.truncate(t.max_len);
        return head;
    }
    mutate_bytes(rng, t, input, pool)
}

fn mutate_bytes(rng: &mut Rng, t: &Target, input: &[u8], pool: &[Vec<u8>]) -> Vec<u8> {
    let mut d = input.to_vec();
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        match rng.below(if t.framed { 12 } else { 9 }) {
            0 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] ^= 1 << rng.below(8);
            }
            1 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] = rng.next_u64() as u8;
            }
            2 => {
                let i = rng.below(d.len() + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                d.splice(i..i, bytes);
            }
            3 if !d.is_empty() => {
                let i = rng.below(d.len());
                let n = 1 + rng.below((d.len() - i).min(64));
                d.drain(i..i + n);
            }
            4 if !t.dict.is_empty() => {
                let w = t.dict[rng.below(t.dict.len())];
                let i = rng.below(d.len() + 1);
                if rng.below(2) == 0 || i + w.len() > d.len() {
                    d.splice(i..i, w.iter().copied());
                } else {
                    d[i..i + w.len()].copy_from_slice(w);
                }
            }
            5 if !pool.is_empty() => {
                // Splice: our head, another's tail.
                let o = &pool[rng.below(pool.len())];
                let i = rng.below(d.len() + 1);
                let j = rng.below(o.len() + 1);
                d.truncate(i);
                d.extend_from_slice(&o[j..]);
            }
            6 if d.len() > 1 => {
                // Duplicate a piece (repeated frames, lines).
                let i = rng.below(d.len());
                let n = 1 + rng.below((d.len() - i).min(256));
                let piece = d[i..i + n].to_vec();
                let at = rng.below(d.len() + 1);
                d.splice(at..at, piece);
            }
            7 if !d.is_empty() => {
                d.truncate(rng.below(d.len()));
            }
            8 if !d.is_empty() => {
                // An interesting integer anywhere, 1/2/4/8 bytes little-endian.
                let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let w = [1, 2, 4, 8][rng.below(4)];
                let i = rng.below(d.len());
                let n = w.min(d.len() - i);
                d[i..i + n].copy_from_slice(&v[..n]);
            }
            m if t.framed => {
                // A field of a frame header, at a frame boundary as the stream declares it.
                let starts = frame_starts(&d, t.name == "wire_header");
                if starts.is_empty() {
                    continue;
                }
                let s = starts[rng.below(starts.len())];
                let h = &mut d[s..s + 32];
                match m {
                    9 => h[0] = rng.below(13) as u8,
                    10 => h[1] = rng.below(6) as u8,
                    _ => {
                        let (off, w) =
                            [(2, 2), (4, 4), (8, 8), (16, 4), (20, 4), (24, 8)][rng.below(6)];
                        let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                        h[off..off + w].copy_from_slice(&v[..w]);
                    }
                }
            }
            _ => {}
        }
    }
    d.truncate(t.max_len);
    d
}

/// Offsets of whole 32-byte headers in a frame stream (following declared payload lengths).
fn frame_starts(d: &[u8], single: bool) -> Vec<usize> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 32 <= d.len() {
        out.push(pos);
        if single {
            break;
        }
        let plen = u32::from_le_bytes([d[pos + 4], d[pos + 5], d[pos + 6], d[pos + 7]]) as usize;
        pos = pos.saturating_add(32).saturating_add(plen);
    }
    out
}

/// Every allocation is counted: the largest single one of an input must stay within a bound
/// that does not depend on the lengths the input declares ("no unbounded allocation from a
/// length field").
struct Counting;

static GLOBAL_LARGEST: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(n: usize) {
    GLOBAL_LARGEST.fetch_max(n, Ordering::Relaxed);
    let _ = LARGEST.try_with(|c| {
        if n > c.get() {
            c.set(n)
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The largest single allocation an input of `len` bytes may cause: proportional to what was
/// fed, plus the target's fixed allowance (engine targets: the wire bound on a payload, 16
/// MiB, counted on every thread of the process).
fn alloc_bound(t: &Target, len: usize) -> usize {
    8 * len
        + if t.slow {
            (16 << 20) + (1 << 20)
        } else {
            128 << 10
        }
}

/// Inputs kept for mutation at most (past it, a new one replaces a random one).
const POOL_MAX: usize = 4096;

static PANICKED: AtomicBool = AtomicBool::new(false);

/// Panics on any thread (the provider's progress thread included) are recorded, so that a
/// crash off the harness's thread is caught too.
fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // The provider's threads (progress, connect helpers) are named "daplrs-...".
            if std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("daplrs-"))
            {
                PANICKED.store(true, Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

/// What a run did.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub inputs: u64,
    pub replayed: u64,
    pub classes: usize,
    pub pool: usize,
    pub elapsed: Duration,
}

/// An input that crashed (panicked or hung) a target, and where it was saved.
#[derive(Debug)]
pub struct Crash {
    pub target: &'static str,
    pub saved: Option<PathBuf>,
    pub message: String,
}

/// Runs one input: its outcome class, or why it crashed (panic, oversized allocation).
pub fn run_one(t: &Target, data: &[u8]) -> Result<u64, String> {
    LARGEST.with(|c| c.set(0));
    if t.slow {
        GLOBAL_LARGEST.store(0, Ordering::Relaxed);
    }
    let r = catch_unwind(AssertUnwindSafe(|| (t.run)(data)));
    let largest = if t.slow {
        GLOBAL_LARGEST.load(Ordering::Relaxed)
    } else {
        LARGEST.with(|c| c.get())
    };
    if r.is_ok() && largest > alloc_bound(t, data.len()) {
        return Err(format!(
            "an input of {} bytes made a single allocation of {largest} bytes",
            data.len()
        ));
    }
    // Only the engine targets run provider threads (with two of them in one process, a
    // progress thread's panic may be reported by the other: its input is saved all the same).
    match r {
        Ok(c) if !t.slow || !PANICKED.swap(false, Ordering::SeqCst) => Ok(c),
        Ok(_) => Err("a panic on another thread (the progress thread?)".into()),
        Err(p) => Err(p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into())),
    }
}

/// Saves a crashing input under fuzz/regressions/<target>/ (named by its content).
fn save_crash(t: &Target, data: &[u8]) -> Option<PathBuf> {
    let dir = fuzz_dir().join("regressions").join(t.name);
    std::fs::create_dir_all(&dir).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(data, &mut h);
    let path = dir.join(format!("crash-{:016x}", std::hash::Hasher::finish(&h)));
    std::fs::write(&path, data).ok()?;
    Some(path)
}

/// Replays every seed, corpus file and regression of `t`, then mutates for `budget` (or
/// `max_inputs`). `save_new` writes inputs of new outcome classes into the corpus directory.
pub fn fuzz(
    t: &'static Target,
    seed: u64,
    budget: Duration,
    max_inputs: u64,
    save_new: bool,
) -> Result<Stats, Crash> {
    install_hook();
    let start = Instant::now();
    let mut stats = Stats::default();
    let mut pool: Vec<Vec<u8>> = seeds::for_target(t.name);
    let corpus_dir = fuzz_dir().join("corpus").join(t.name);
    for sub in [
        corpus_dir.clone(),
        fuzz_dir().join("regressions").join(t.name),
    ] {
        pool.extend(read_dir_inputs(&sub).into_iter().map(|(_, d)| d));
    }
    let mut classes = HashSet::new();
    let crash = |data: &[u8], message: String| Crash {
        target: t.name,
        saved: save_crash(t, data),
        message,
    };
    for d in &pool {
        match run_one(t, d) {
            Ok(c) => {
                classes.insert(c);
            }
            Err(m) => {
                return Err(Crash {
                    target: t.name,
                    saved: None,
                    message: format!("a seed/corpus/regression input fails: {m}"),
                })
            }
        }
        stats.replayed += 1;
    }
    if pool.is_empty() {
        pool.push(Vec::new());
    }
    let mut rng = Rng::new(seed ^ fxhash(t.name.as_bytes()));
    while stats.inputs < max_inputs && start.elapsed() < budget {
        let base = pool[rng.below(pool.len())].clone();
        let input = mutate(&mut rng, t, &base, &pool);
        stats.inputs += 1;
        match run_one(t, &input) {
            Ok(c) => {
                if classes.insert(c) {
                    if save_new {
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        std::hash::Hash::hash(&input, &mut h);
                        let _ = std::fs::create_dir_all(&corpus_dir);
                        let _ = std::fs::write(
                            corpus_dir.join(format!("new-{:016x}", std::hash::Hasher::finish(&h))),
                            &input,
                        );
                    }
                    if pool.len() < POOL_MAX {
                        pool.push(input);
                    } else {
                        let i = rng.below(pool.len());
                        pool[i] = input;
                    }
                }
            }
            Err(m) => return Err(crash(&input, m)),
        }
    }
    stats.classes = classes.len();
    stats.pool = pool.len();
    stats.elapsed = start.elapsed();
    Ok(stats)
}

/// Replays the saved regression inputs of `t` only: each must now pass.
pub fn replay_regressions(t: &Target) -> Result<usize, String> {
    install_hook();
    let files = read_dir_inputs(&fuzz_dir().join("regressions").join(t.name));
    for (path, d) in &files {
        run_one(t, d).map_err(|m| format!("{}: {m}", path.display()))?;
    }
    Ok(files.len())
}

fn fxhash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}
