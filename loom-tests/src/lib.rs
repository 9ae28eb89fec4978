//! loom models live in tests/; see the crate description.
