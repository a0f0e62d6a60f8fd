//! What every generating engine does on the CPU around its forward passes, shared so that the
//! engines behave alike: choosing the next token from the logits for a request's [`Sampling`]
//! settings ([`Sampler`], with llama-server's order and llama.cpp's semantics), reading logprobs
//! and the argmax off the logits, keeping idle sequences' state in host memory ([`PrefixStore`]),
//! pacing prompt tokens while others generate ([`Pacer`]) and drafting tokens for speculative
//! decoding from the sequence's own text ([`Speculator`]).
//!
//! The llama.cpp plugin samples through [`Direct`] where it applies and llama.cpp's own sampler
//! chain elsewhere; an engine without llama.cpp uses [`Sampler`], which adds the pure-Rust
//! [`Chain`].
//!
//! No FFI. The one `unsafe` is the AVX2 build of the temperature sampler's inner loop, called
//! only after the CPU was checked for AVX2 and FMA (`temperature.rs`).
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod chain;
mod draft;
mod logits;
mod pacing;
mod prefix_store;
mod step_cost;
mod temperature;

pub use chain::{is_greedy, random_seed, Chain, DevicePick, Direct, Sampler, PENALTY_LAST_N};
pub use draft::{parse_draft_max, parse_draft_threshold, DraftSettings, Speculator, UNKNOWN_COST_THRESHOLD};
pub use llmr_engine_types::Sampling;
pub use logits::{argmax, logprobs};
pub use pacing::Pacer;
pub use prefix_store::{common_prefix, PrefixStore};
pub use step_cost::StepCost;
pub use temperature::{Draw, TemperatureSampler};
