pub mod backend;
pub mod core;
