//! Variables libfabric reads added to the process's environment where the user set none,
//! safely for every thread reading it meanwhile, C threads too.
//!
//! setenv(3) is not: glibc grows the environment array it allocated last with realloc, so a
//! getenv(3) walking that array on another thread can read freed memory (a test's thread
//! crashed so; std's lock covers Rust readers only). Here the new array is built whole,
//! published with one pointer store and never freed, nor is any array before it: a reader
//! sees the old array or the new one, both complete. glibc copies an array it did not
//! allocate at the next setenv, so later changes by the program work as before.

use std::ffi::CString;
use std::sync::atomic::{AtomicPtr, Ordering};

use libc::c_char;

extern "C" {
    /// The process's environment (POSIX: a program may point it at an array of its own).
    static mut environ: *mut *mut c_char;
}

/// Adds each `(name, value)` whose name the environment lacks, all in one new array. Names
/// and values hold no NUL or '=' (they are ours); such a pair is skipped.
pub(crate) fn add_defaults(defaults: &[(&str, &str)]) {
    let added: Vec<*mut c_char> = defaults
        .iter()
        .filter(|(name, _)| !name.contains('=') && std::env::var_os(name).is_none())
        .filter_map(|(name, value)| CString::new(format!("{name}={value}")).ok())
        .map(CString::into_raw)
        .collect();
    if added.is_empty() {
        return;
    }
    // SAFETY: `environ` is a valid static; it is read and written as an atomic pointer
    // (AtomicPtr has the layout of a pointer), as concurrent readers only load it.
    let published = unsafe { AtomicPtr::from_ptr(std::ptr::addr_of_mut!(environ)) };
    let old = published.load(Ordering::Acquire);
    let mut entries: Vec<*mut c_char> = Vec::new();
    if !old.is_null() {
        // SAFETY: the environment is a NULL-terminated array of C strings, never freed
        // while we read it (setenv from another thread at once is the program's own race,
        // as POSIX says of setenv itself).
        unsafe {
            let mut at = old;
            while !(*at).is_null() {
                entries.push(*at);
                at = at.add(1);
            }
        }
    }
    entries.extend(added);
    entries.push(std::ptr::null_mut());
    // Leaked on purpose: a reader may hold it for as long as it likes.
    let new = Box::leak(entries.into_boxed_slice()).as_mut_ptr();
    published.store(new, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// The tests change the environment with std's set_var too, which is glibc's setenv: one
    /// at a time, so that one's setenv never frees an array the other's C readers walk.
    static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    fn c_getenv(name: &str) -> Option<String> {
        let name = CString::new(name).unwrap();
        // SAFETY: a C string of ours; the result is copied at once.
        let p = unsafe { libc::getenv(name.as_ptr()) };
        if p.is_null() {
            return None;
        }
        // SAFETY: getenv's result, not NULL: a C string in the environment.
        Some(
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into(),
        )
    }

    /// Added where missing, kept where set, seen by C's getenv and by std.
    #[test]
    fn adds_only_what_is_missing() {
        let _one = ONE_AT_A_TIME.lock();
        let set = format!("DAPLRS_ENV_TEST_SET_{}", std::process::id());
        let unset = format!("DAPLRS_ENV_TEST_UNSET_{}", std::process::id());
        std::env::set_var(&set, "user");
        add_defaults(&[(&set, "ours"), (&unset, "ours"), ("BAD=NAME", "x")]);
        assert_eq!(c_getenv(&set).as_deref(), Some("user"));
        assert_eq!(c_getenv(&unset).as_deref(), Some("ours"));
        assert_eq!(std::env::var(&unset).as_deref(), Ok("ours"));
        assert_eq!(c_getenv("BAD"), None);
        // The program's own changes after ours work as before.
        std::env::set_var(&unset, "changed");
        assert_eq!(c_getenv(&unset).as_deref(), Some("changed"));
        std::env::remove_var(&unset);
        assert_eq!(c_getenv(&unset), None);
        std::env::remove_var(&set);
    }

    /// Threads calling C's getenv all along (no lock of std's) while variables are added
    /// one by one, each time a new array: every look finds the variable that was there
    /// before, and no look faults.
    #[test]
    fn readers_in_c_meanwhile() {
        let _one = ONE_AT_A_TIME.lock();
        let always = format!("DAPLRS_ENV_TEST_ALWAYS_{}", std::process::id());
        std::env::set_var(&always, "here");
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(std::sync::Barrier::new(3));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (stop, always, started) = (stop.clone(), always.clone(), started.clone());
                std::thread::spawn(move || {
                    started.wait();
                    let mut looks = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        assert_eq!(c_getenv(&always).as_deref(), Some("here"));
                        looks += 1;
                    }
                    looks
                })
            })
            .collect();
        started.wait();
        for i in 0..300 {
            let name = format!("DAPLRS_ENV_TEST_{}_{i}", std::process::id());
            add_defaults(&[(&name, "1")]);
            // Each array stays in use a while by the readers before the next replaces it.
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
        assert_eq!(c_getenv(&always).as_deref(), Some("here"));
    }
}
