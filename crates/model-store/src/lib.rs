//! The node's local model store.

pub mod gguf;
