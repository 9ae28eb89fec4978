//! The keyed maps: `Keyed<K, L>` (`keyed`, `keyed_stress`), the maps with the state inline
//! (`bucket`, `leaky`, `meter`, `sliding`, `smooth`, `warming`, `window`, each with its `_stress`
//! races), `per_key`'s bound (`bound`) and the fixed-memory sketch (`sketch`, `sketch_sim`,
//! `sketch_stress`).
//! One test binary of one module per file, so the suite
//! links one binary here rather than one per file (each links the whole dev-dependency tree;
//! CONTRIBUTING.md, "Where things go"). Run one module with a filter:
//! `cargo test --all-features --test keyed -- bucket_stress::`.
//!
//! Not here: `tests/keyed_memory.rs`, a binary of its own, because it counts every allocation of
//! the process with a global allocator.
#![cfg(feature = "keyed")]

#[path = "../common/mod.rs"]
mod common;

mod bound;
mod bucket;
mod bucket_stress;
mod keyed;
mod keyed_stress;
mod leaky;
mod leaky_stress;
mod meter;
mod sketch;
mod sketch_sim;
mod sketch_stress;
mod sliding;
mod sliding_stress;
mod smooth;
mod smooth_stress;
mod warming;
mod warming_stress;
mod window;
mod window_stress;
