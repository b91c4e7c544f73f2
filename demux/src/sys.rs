//! The libc wrappers the data plane and the controller use: the `sys` crate's, under
//! the names this crate has always used.

pub use ::sys::addr::{local_addr, sockaddr_from_bytes, storage_bytes, to_sockaddr};
pub use ::sys::sockopt::{peer_cred, setsockopt_int};
pub use ::sys::{cvt, cvt_isize, os_random, owned, Epoll};
