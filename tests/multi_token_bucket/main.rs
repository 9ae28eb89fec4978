//! `MultiTokenBucket` (several GCRA limits in one word), `KeyedMultiTokenBucket` and their
//! twin. One test binary of one module per file (CONTRIBUTING.md, "Where things go"). Run one
//! module with a filter: `cargo test --all-features --test multi_token_bucket -- differential::`.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod differential;
mod semantics;
mod stress;
