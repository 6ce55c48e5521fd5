//! What the fuzzers (`src/fuzz`, crate `dat-fuzz`, and the cargo-fuzz targets in `fuzz/` over it)
//! need of the provider's private parts, and nothing else: compiled only with the `fuzzing`
//! feature, which `dat-fuzz` enables and the shipped libraries (libdaplrs.so.2,
//! libdaplrs-verbs.so.2) never do. The same feature makes `backend::tcp::wire` public. The
//! harnesses themselves live in `dat-fuzz` (docs/fuzzing.md).

use std::io;
use std::net::{SocketAddrV4, TcpStream};
use std::time::Duration;

/// The words of an IA's `ia_params` as the provider splits them (transport, target, optional
/// port), for the `ia_params` target.
pub fn parse_ia_params(ia_params: &str) -> (&str, &str, Option<&str>) {
    crate::device::parse_ia_params(ia_params)
}

/// A TCP connection with SO_REUSEADDR, as the provider makes its own: the engine harnesses'
/// peers make thousands of connections and must not leave ports other programs listen on in
/// TIME_WAIT (see `backend::tcp::sys::connect_reusable`).
pub fn connect_reusable(remote: SocketAddrV4, limit: Duration) -> io::Result<TcpStream> {
    crate::backend::tcp::connect_reusable(remote, limit)
}
