//! Shim for test files still written as their own binary (`mod common;`) until they are
//! folded into tests/api/ as modules: the one harness, not a copy of it.

#[path = "../api/helpers.rs"]
mod helpers;
pub use helpers::*;
