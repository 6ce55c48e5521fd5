//! Copies and atomics on registered memory that survive the memory going away.
//!
//! An RDMA device pins what is registered: if the application unmaps it, the device still
//! reads the old pages. We pin nothing, and the consumer may unmap (or mprotect) memory while
//! it is registered: a CPU copy from it for a peer's RDMA read would kill the process with
//! SIGSEGV, or read whatever was mapped there since. Asking the kernel to copy
//! (process_vm_readv on ourselves) reports EFAULT instead, but costs a system call per copy
//! (1.1 µs for 8 B here, against 4 ns), on every message. So the copy is the CPU's, in a
//! routine of our own whose faulting instruction is known: a SIGSEGV/SIGBUS handler that finds
//! the fault there resumes the routine at its recovery point, which returns "not there". Every
//! other fault goes to the handler installed before ours (or the default action), as if ours
//! were not there. The cost on the path of every message: none (a `rep movsb` instead of
//! memcpy).
//!
//! Where this is not built (not x86_64), the kernel copies.

use std::sync::Once;

/// Installs the fault handler (once; `copy` and `atomic` do it too).
pub fn install() {
    imp::install();
}

/// Copies `len` bytes from `src` to `dst`; false if a page of either was not there (or not
/// writable at `dst`): then some prefix may have been copied.
///
/// # Safety
/// Each range is either memory of ours that stays valid for the call, or lies inside a live
/// registration (which the consumer may have unmapped since: that is what is guarded).
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    imp::install();
    // SAFETY: the caller's promise; a fault in the copy is recovered (`imp`).
    unsafe { imp::copy(dst, src, len) }
}

/// Whether every page of `[addr, addr + len)` is there to read now: one byte of each read
/// through `copy` (a few ns a page; the kernel's answer, PROCMAP_QUERY, costs 0.85 µs here).
///
/// # Safety
/// As for `copy`.
pub unsafe fn readable(addr: u64, len: usize) -> bool {
    let page = 4096u64; // the smallest page size: larger pages are probed more often, not less
    let Some(last) = addr.checked_add(len.max(1) as u64 - 1) else {
        return false;
    };
    let mut byte = 0u8;
    let mut at = addr;
    loop {
        // SAFETY: `at` is inside the caller's range; `byte` is ours.
        if !unsafe { copy(&mut byte, at as usize as *const u8, 1) } {
            return false;
        }
        if at >= last & !(page - 1) {
            return true;
        }
        at = (at & !(page - 1)) + page;
    }
}

/// A 64-bit atomic on the word at `addr`: fetch-and-add of `operand`, or with `swap`
/// compare-and-swap against `operand`. The word's previous value; None if it was not there.
///
/// # Safety
/// `addr` is 8-byte aligned and lies inside a live registration (see `copy`).
pub unsafe fn atomic(addr: *mut u64, operand: u64, swap: Option<u64>) -> Option<u64> {
    imp::install();
    // SAFETY: the caller's promise; a fault on the word is recovered (`imp`).
    unsafe { imp::atomic(addr, operand, swap) }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use super::Once;
    use std::cell::UnsafeCell;
    use std::sync::atomic::{AtomicBool, Ordering};

    // Leaf routines (System V ABI: arguments in rdi, rsi, rdx, rcx; status in eax, 0 done,
    // 1 faulted). The instruction that touches registered memory is the one after each
    // `_at` label; the handler resumes a fault there at `daplrs_guarded_recover`. No stack is
    // used before it, so `ret` from the recovery point returns to the caller.
    std::arch::global_asm!(
        ".pushsection .text.daplrs_guarded,\"ax\",@progbits",
        ".p2align 4",
        ".globl daplrs_guarded_copy",
        ".hidden daplrs_guarded_copy",
        "daplrs_guarded_copy:", // (dst, src, len)
        "mov rcx, rdx",
        ".globl daplrs_guarded_copy_at",
        ".hidden daplrs_guarded_copy_at",
        "daplrs_guarded_copy_at:",
        "rep movsb",
        "xor eax, eax",
        "ret",
        ".globl daplrs_guarded_fetch_add",
        ".hidden daplrs_guarded_fetch_add",
        "daplrs_guarded_fetch_add:", // (addr, operand, *old)
        "mov rax, rsi",
        ".globl daplrs_guarded_fetch_add_at",
        ".hidden daplrs_guarded_fetch_add_at",
        "daplrs_guarded_fetch_add_at:",
        "lock xadd qword ptr [rdi], rax",
        "mov qword ptr [rdx], rax",
        "xor eax, eax",
        "ret",
        ".globl daplrs_guarded_cmp_swap",
        ".hidden daplrs_guarded_cmp_swap",
        "daplrs_guarded_cmp_swap:", // (addr, expected, new, *old)
        "mov rax, rsi",
        ".globl daplrs_guarded_cmp_swap_at",
        ".hidden daplrs_guarded_cmp_swap_at",
        "daplrs_guarded_cmp_swap_at:",
        "lock cmpxchg qword ptr [rdi], rdx",
        "mov qword ptr [rcx], rax",
        "xor eax, eax",
        "ret",
        ".globl daplrs_guarded_recover",
        ".hidden daplrs_guarded_recover",
        "daplrs_guarded_recover:",
        "mov eax, 1",
        "ret",
        ".popsection",
    );

    extern "C" {
        fn daplrs_guarded_copy(dst: *mut u8, src: *const u8, len: usize) -> u32;
        fn daplrs_guarded_fetch_add(addr: *mut u64, operand: u64, old: *mut u64) -> u32;
        fn daplrs_guarded_cmp_swap(addr: *mut u64, expected: u64, new: u64, old: *mut u64) -> u32;
        static daplrs_guarded_copy_at: u8;
        static daplrs_guarded_fetch_add_at: u8;
        static daplrs_guarded_cmp_swap_at: u8;
        static daplrs_guarded_recover: u8;
    }

    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> bool {
        // SAFETY: the caller's promise (super::copy).
        unsafe { daplrs_guarded_copy(dst, src, len) == 0 }
    }

    pub(super) unsafe fn atomic(addr: *mut u64, operand: u64, swap: Option<u64>) -> Option<u64> {
        let mut old = 0u64;
        // SAFETY: the caller's promise (super::atomic); `old` is ours.
        let status = unsafe {
            match swap {
                None => daplrs_guarded_fetch_add(addr, operand, &mut old),
                Some(new) => daplrs_guarded_cmp_swap(addr, operand, new, &mut old),
            }
        };
        (status == 0).then_some(old)
    }

    /// The actions SIGSEGV and SIGBUS had before ours, for the faults that are not ours:
    /// written before our handler is installed, read only by it.
    struct Previous(UnsafeCell<[libc::sigaction; 2]>);
    // SAFETY: written only by `install_now` before the handler that reads it is installed.
    unsafe impl Sync for Previous {}
    // SAFETY: an all-zero sigaction is SIG_DFL with no flags.
    static PREVIOUS: Previous = Previous(UnsafeCell::new(unsafe { std::mem::zeroed() }));
    static READY: AtomicBool = AtomicBool::new(false);

    pub(super) fn install() {
        static INSTALLED: Once = Once::new();
        INSTALLED.call_once(install_now);
    }

    /// Keeps the actions in place and installs ours over them. No allocation (also called in
    /// a forked child by the tests).
    pub(super) fn install_now() {
        // SAFETY: sigaction with a zeroed struct, our handler and an empty mask; the previous
        // actions are stored before ours can run.
        unsafe {
            let previous = &mut *PREVIOUS.0.get();
            for (i, sig) in [libc::SIGSEGV, libc::SIGBUS].into_iter().enumerate() {
                libc::sigaction(sig, std::ptr::null(), &mut previous[i]);
            }
            READY.store(true, Ordering::Release);
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = on_fault as *const () as usize;
            ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut ours.sa_mask);
            for sig in [libc::SIGSEGV, libc::SIGBUS] {
                libc::sigaction(sig, &ours, std::ptr::null_mut());
            }
        }
    }

    /// Whether the faulting instruction `ip` is one of ours that touches registered memory.
    fn ours(ip: usize) -> bool {
        // SAFETY: only the addresses of the labels are taken.
        let ats = unsafe {
            [
                &daplrs_guarded_copy_at as *const u8 as usize,
                &daplrs_guarded_fetch_add_at as *const u8 as usize,
                &daplrs_guarded_cmp_swap_at as *const u8 as usize,
            ]
        };
        ats.contains(&ip)
    }

    /// Async-signal-safe: reads the context, writes its instruction pointer, or passes the
    /// signal on.
    extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let uc = ctx as *mut libc::ucontext_t;
        let ip_slot = libc::REG_RIP as usize;
        // SAFETY: the kernel passes a valid ucontext to an SA_SIGINFO handler.
        let ip = unsafe { (*uc).uc_mcontext.gregs[ip_slot] } as usize;
        if ours(ip) {
            // SAFETY: as above; the recovery point is a label of our routines.
            unsafe {
                (*uc).uc_mcontext.gregs[ip_slot] =
                    &daplrs_guarded_recover as *const u8 as usize as i64;
            }
            return;
        }
        pass_on(sig, info, ctx);
    }

    /// The fault is not ours: to the handler before ours, or, where that was the default
    /// action (or ignore, which the kernel does not honour for a fault), back to the default:
    /// the faulting instruction runs again on return and the process ends as it would have.
    fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        if !READY.load(Ordering::Acquire) {
            return default(sig);
        }
        let slot = if sig == libc::SIGBUS { 1 } else { 0 };
        // SAFETY: written before our handler was installed (`install_now`).
        let previous = unsafe { (*PREVIOUS.0.get())[slot] };
        match previous.sa_sigaction {
            libc::SIG_DFL | libc::SIG_IGN => default(sig),
            handler if previous.sa_flags & libc::SA_SIGINFO != 0 => {
                // SAFETY: the previous handler was installed with SA_SIGINFO: this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(handler) };
                f(sig, info, ctx);
            }
            handler => {
                // SAFETY: the previous handler was installed without SA_SIGINFO.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
                f(sig);
            }
        }
    }

    fn default(sig: libc::c_int) {
        // SAFETY: sigaction is async-signal-safe; a zeroed action is SIG_DFL.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    //! The kernel copies (process_vm_readv/writev on ourselves: EFAULT for memory that is not
    //! there); atomics on a word that is not there are refused after asking the kernel.

    pub(super) fn install() {}

    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> bool {
        let ours = libc::iovec {
            iov_base: dst as *mut libc::c_void,
            iov_len: len,
        };
        let theirs = libc::iovec {
            iov_base: src as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: both ranges are this process's; the kernel checks them.
        let rc = unsafe { libc::process_vm_readv(libc::getpid(), &ours, 1, &theirs, 1, 0) };
        rc >= 0 && rc as usize == len
    }

    pub(super) unsafe fn atomic(addr: *mut u64, operand: u64, swap: Option<u64>) -> Option<u64> {
        use std::sync::atomic::{AtomicU64, Ordering};
        if !daplrs_backend::mapping::mapped(addr as u64, 8, true) {
            return None;
        }
        // SAFETY: the caller's promise, and the word was there just now.
        let word = unsafe { AtomicU64::from_ptr(addr) };
        Some(match swap {
            None => word.fetch_add(operand, Ordering::SeqCst),
            Some(new) => {
                match word.compare_exchange(operand, new, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(old) | Err(old) => old,
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::test_pages::Pages;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn copies_and_atomics_work_and_missing_memory_is_reported() {
        let page = 4096;
        let pages = Pages::new(2 * page);
        let m = pages.ptr;
        let mut buf = vec![0u8; 3 * page];
        // SAFETY: our mapping and buffer throughout.
        unsafe {
            std::ptr::write_bytes(m, 7, 2 * page);
            assert!(copy(buf.as_mut_ptr(), m, 2 * page));
            assert!(readable(m as u64 + 100, 2 * page - 200));
            assert!(buf[..2 * page].iter().all(|&b| b == 7));
            assert_eq!(atomic(m as *mut u64, 5, None), Some(0x0707_0707_0707_0707));
            assert_eq!(
                atomic(m as *mut u64, 0x0707_0707_0707_070c, Some(1)),
                Some(0x0707_0707_0707_070c)
            );
            assert_eq!(*(m as *mut u64), 1);
            // The second page goes (no access: unmapped, another test's thread could map
            // something there meanwhile): a copy across it stops there, into it too.
            libc::mprotect(m.add(page) as *mut libc::c_void, page, libc::PROT_NONE);
            assert!(!copy(buf.as_mut_ptr(), m, 2 * page));
            assert!(!readable(m as u64 + 100, page));
            assert!(readable(m as u64 + 100, page - 100));
            assert!(!copy(m.add(page), buf.as_ptr(), 8));
            assert_eq!(atomic(m.add(page) as *mut u64, 1, None), None);
            assert_eq!(atomic(m.add(page) as *mut u64, 1, Some(2)), None);
            // Read-only now: reads work, writes and atomics are refused.
            libc::mprotect(m as *mut libc::c_void, page, libc::PROT_READ);
            assert!(copy(buf.as_mut_ptr(), m, 16));
            assert!(!copy(m, buf.as_ptr(), 16));
            assert_eq!(atomic(m as *mut u64, 1, None), None);
        }
    }

    static FIXED: AtomicBool = AtomicBool::new(false);
    static mut PAGE: usize = 0;

    extern "C" fn fix_up(_sig: libc::c_int) {
        FIXED.store(true, Ordering::SeqCst);
        // SAFETY: the test's page, made writable again so that the access is retried well.
        unsafe {
            libc::mprotect(
                PAGE as *mut libc::c_void,
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
            );
        }
    }

    /// A fault that is not ours reaches the handler installed before ours (in a child
    /// process: signal actions are the whole process's, and other tests fault on purpose).
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn other_faults_reach_the_handler_before_ours() {
        let pages = Pages::new(4096);
        let m = pages.ptr;
        // SAFETY: the child only makes async-signal-safe calls and ends with _exit; the
        // handler only fixes the test's page.
        unsafe {
            PAGE = m as usize;
            let child = libc::fork();
            assert!(child >= 0);
            if child == 0 {
                let mut fix: libc::sigaction = std::mem::zeroed();
                fix.sa_sigaction = fix_up as *const () as usize;
                libc::sigaction(libc::SIGSEGV, &fix, std::ptr::null_mut());
                imp::install_now();
                libc::mprotect(m as *mut libc::c_void, 4096, libc::PROT_READ);
                std::ptr::write_volatile(m, 1);
                let ok = FIXED.load(Ordering::SeqCst) && std::ptr::read_volatile(m) == 1;
                libc::_exit(if ok { 0 } else { 1 });
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(child, &mut status, 0), child);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "the child's fault did not reach its handler (status {status:#x})"
            );
        }
    }
}
