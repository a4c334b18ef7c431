//! Fake runtime tests.
