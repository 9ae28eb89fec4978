//! `TokenBucket` (x/time/rate), its mutex twin, and `Sometimes` (x/time/rate's too). One test
//! binary of one module per file, so the suite links one binary here rather than one per file (each
//! links the whole dev-dependency tree; CONTRIBUTING.md, "Where things go"). Run one module with a
//! filter: `cargo test --all-features --test token_bucket -- precision::`.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod differential;
mod precision;
mod reference;
mod semantics;
mod sometimes;
mod stress;
mod waits;
