#![deny(unsafe_op_in_unsafe_fn)]
pub mod backend;
pub mod core;
pub mod device;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod intmap;
pub(crate) mod mapping;
