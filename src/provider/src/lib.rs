pub mod backend;
pub mod core;
pub mod device;
#[doc(hidden)]
pub mod fuzzing;
pub mod intmap;
pub(crate) mod mapping;
