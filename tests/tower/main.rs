//! The tower middleware (feature `tower`; `axum`, `tonic` and `redis` where a module says so), and
//! the HTTP example's machinery run briefly (`http_example_smoke`). One test binary of one module
//! per file, so the suite links one binary here rather than one per file (each links the whole
//! dev-dependency tree; CONTRIBUTING.md, "Where things go"). Run one module with a filter:
//! `cargo test --all-features --test tower -- hostile::`.
//!
//! Two modules set process-wide state, which no other module here meets:
//!
//! - `hostile` makes its counting allocator the binary's `#[global_allocator]`; it counts per
//!   thread, so no other test's allocations land in its counts;
//! - `faults` installs a global `tracing` subscriber (once) and reads only the events of its
//!   own fleet policies (each named for its test); the only other fleet policy here, `http`'s
//!   on a live Redis, has nothing to log.
#![cfg(feature = "tower")]

#[path = "../common/mod.rs"]
mod common;

mod cost;
mod enforcement;
mod faults;
mod grpc;
mod headers;
mod hostile;
mod http;
mod http_example_smoke;
mod multi;
