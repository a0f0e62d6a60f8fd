//! Constrained decoding, shared by the engines that sample from their own logits (the llama.cpp
//! plugin and the native engine), so that a JSON schema or a grammar means the same in both.
//!
//! A model's [`Vocabulary`] (every token's bytes, its end tokens) is compiled once into
//! llguidance's token trie and parser factory; each constrained request gets a [`TokenMask`]
//! from it, which masks the logits before every draw ([`TokenMask::apply`]) and follows the
//! tokens drawn ([`TokenMask::accept`]). When the grammar allows nothing more, only the model's
//! end tokens are left, so a constrained output ends where its grammar does and always parses
//! (unless `max_tokens` cuts it: `finish_reason` then says `length`).
//!
//! [`ConstrainedSampler`] is the draw itself (mask, the request's `llmr_sampling::Sampler`,
//! follow), as both engines run it.
//!
//! Unconstrained requests never reach this crate: an engine holds a `TokenMask` only for the
//! requests that carry a constraint.

mod grammar;
mod mask;
mod sampler;
mod vocabulary;

pub use grammar::CompileError;
pub use llmr_engine_types::Constraint;
pub use mask::TokenMask;
pub use sampler::ConstrainedSampler;
pub use vocabulary::{TokenBytes, Vocabulary, VocabularyError};
