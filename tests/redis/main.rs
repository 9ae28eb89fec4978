//! The Redis limiters (feature `redis`), each test against a `redis-server` of its own
//! (`tests/common/redis_server.rs`), and the Redis example's machinery run briefly
//! (`example_smoke`). One test binary of one module per file, so the suite links one binary here
//! rather than one per file (each links the whole dev-dependency tree; CONTRIBUTING.md, "Where
//! things go"). Run one module with a filter:
//! `cargo test --all-features --test redis -- token_bucket::`.
//!
//! Not here: `tests/redis_fallback_tracing.rs`, a binary of its own, because `tracing` caches each
//! call site's interest process-wide (see its header). The fault tests (`faults`) run one at a time
//! among themselves; the other modules' tests run beside them, as beside any other load.
#![cfg(feature = "redis")]

#[path = "../common/mod.rs"]
mod common;

mod blocking;
mod cluster;
mod coalesce;
mod coalesce_compat;
mod example_smoke;
mod fallback;
mod fallback_limiters;
mod faults;
mod gcra;
mod harness;
mod leased;
mod multi_gcra;
mod token_bucket;
mod window;
