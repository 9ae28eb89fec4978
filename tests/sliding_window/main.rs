//! `SlidingWindow`, the sliding-window counter, and its mutex twin. One test binary of one module
//! per file, so the suite links one binary here rather than one per file (each links the whole
//! dev-dependency tree; CONTRIBUTING.md, "Where things go"). Run one module with a filter:
//! `cargo test --all-features --test sliding_window -- stress::`.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod differential;
mod semantics;
mod stress;
