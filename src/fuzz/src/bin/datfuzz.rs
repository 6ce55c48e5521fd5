//! datfuzz: the in-house fuzzer's long run (`make fuzz` without nightly/cargo-fuzz) and corpus
//! writer.
//!
//! ```text
//! datfuzz [--seconds N] [--seed S] [--save-new] [TARGET...]   fuzz (default: every target)
//! datfuzz --write-corpus                                     write the built-in seeds to fuzz/corpus
//! datfuzz --list                                             the target names
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

use std::time::Duration;

fn main() {
    let mut seconds = 60u64;
    let mut seed = 1u64;
    let mut save_new = false;
    let mut names = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--seconds N")
            }
            "--seed" => seed = args.next().and_then(|v| v.parse().ok()).expect("--seed S"),
            "--save-new" => save_new = true,
            "--list" => {
                for t in dat_fuzz::TARGETS {
                    println!("{}", t.name);
                }
                return;
            }
            "--write-corpus" => {
                for t in dat_fuzz::TARGETS {
                    let dir = dat_fuzz::fuzz_dir().join("corpus").join(t.name);
                    std::fs::create_dir_all(&dir).expect("corpus dir");
                    for (i, d) in dat_fuzz::seeds::for_target(t.name).iter().enumerate() {
                        std::fs::write(dir.join(format!("seed-{i:02}")), d).expect("write seed");
                    }
                }
                return;
            }
            n if dat_fuzz::target(n).is_some() => names.push(n.to_string()),
            other => {
                eprintln!("datfuzz: unknown argument or target '{other}' (--list)");
                std::process::exit(2);
            }
        }
    }
    if names.is_empty() {
        names = dat_fuzz::TARGETS
            .iter()
            .map(|t| t.name.to_string())
            .collect();
    }
    let mut failed = false;
    for n in &names {
        let t = dat_fuzz::target(n).expect("known target");
        match dat_fuzz::fuzz(t, seed, Duration::from_secs(seconds), u64::MAX, save_new) {
            Ok(s) => println!(
                "datfuzz: {:<17} {:>10} inputs in {:>6.1}s ({:>8.0}/s), {} replayed, {} outcome classes",
                t.name,
                s.inputs,
                s.elapsed.as_secs_f64(),
                s.inputs as f64 / s.elapsed.as_secs_f64().max(1e-9),
                s.replayed,
                s.classes
            ),
            Err(c) => {
                failed = true;
                println!(
                    "datfuzz: {:<17} CRASH: {} (input saved to {})",
                    c.target,
                    c.message,
                    c.saved
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "-".into())
                );
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
