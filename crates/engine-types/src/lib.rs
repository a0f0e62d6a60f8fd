//! The engine contract in plain Rust: what a model is stored as ([`Format`]), what it can do
//! ([`Capability`]), what an engine reports about it ([`ModelInfo`], the typed form of
//! `llmr_engine_model_info`'s JSON) and how to sample from it ([`Sampling`]).
//!
//! One definition each, shared by the wire crate (which validates requests into [`Sampling`] and renders [`TokenLogprob`]s),
//! the host (which writes them into the ABI's structs) and the plugin SDK (which reads them back),
//! so a setting is converted once per hop and never copied field by field in between.
#![forbid(unsafe_code)]

mod capability;
mod constraint;
mod format;
mod logprob;
mod model_info;
mod sampling;
mod sampling_defaults;

pub use capability::Capability;
pub use constraint::Constraint;
pub use format::Format;
pub use logprob::TokenLogprob;
pub use model_info::ModelInfo;
pub use sampling::Sampling;
pub use sampling_defaults::{SamplingDefaults, UnsetSampling};
