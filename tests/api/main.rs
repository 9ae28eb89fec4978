//! The crate as a user meets it: the README's programs, the five-minute API, `quota_at` and
//! `refund_n_at` on every limiter, and the shootout example's machinery run briefly (the HTTP and
//! Redis examples' are in `tower` and `redis`). One test binary of one module per file, so the
//! suite links one binary here rather than one per file (each links the whole dev-dependency tree;
//! CONTRIBUTING.md, "Where things go"). Run one module with a filter:
//! `cargo test --all-features --test api -- shootout_smoke::`.

#[path = "../common/mod.rs"]
mod common;

mod lease;
mod public_api;
mod quota_and_refund;
mod readme_programs;
mod shootout_smoke;
