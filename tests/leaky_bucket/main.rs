//! `LeakyBucket` (uber-go/ratelimit) and `LeakyMeter` (the water-level leaky bucket, `meter`). One
//! test binary of one module per file, so the suite links one binary here rather than one per file
//! (each links the whole dev-dependency tree; CONTRIBUTING.md, "Where things go"). Run one module
//! with a filter: `cargo test --all-features --test leaky_bucket -- meter::`.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod differential;
mod meter;
mod semantics;
mod stress;
