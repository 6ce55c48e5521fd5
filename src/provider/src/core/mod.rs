//! The safe core: DAT objects, their state machines and rules, over the backend traits.
//!
//! Every object type has its module; `handle` is the one handle mechanism the ffi layer uses to
//! turn C handles into objects; `error` maps onto DAT_RETURN.

pub mod cno;
pub mod consts;
pub mod cr;
pub mod ep;
pub mod error;
pub mod evd;
pub mod handle;
pub mod ia;
pub mod lmr;
pub mod pz;
pub mod rmr;
pub mod sp;
pub mod srq;

#[cfg(test)]
mod tests;
