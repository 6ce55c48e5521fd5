//! libdaplrs.so.2: the C face of the udapl-rs provider.
//!
//! This crate is the thin, mechanical layer between the DAT_PROVIDER table
//! libdat2 (ours or OFED's) dispatches through and the safe core in
//! `daplrs`. Each module serves one DAT object and only translates: C
//! arguments to core calls, core results to DAT_RETURN and C structs. Every
//! raw pointer is read or written here, through the helpers in
//! [`boundary`], and every entry point runs inside [`boundary::guard`] with its
//! C argument list from [`calls`] (which places every refused argument), so a
//! panic never unwinds into C.
//!
//! [`provider`] holds the table and `dat_provider_init`/`dat_provider_fini`;
//! [`v12`] serves DAT 1.2 (libdat.so.1) from the same functions.
#![deny(unsafe_op_in_unsafe_fn)]

mod boundary;
mod calls;
mod cno;
mod cr;
mod csp;
mod ep;
mod evd;
mod ext;
mod ia;
mod lmr;
mod provider;
mod pz;
mod rmr;
mod sp;
mod srq;
mod v12;

pub use provider::{dat_provider_fini, dat_provider_init};
