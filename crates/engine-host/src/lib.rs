//! The engine host: discovers plugin folders, validates manifests, loads shared libraries over
//! the llmr C ABI (`llmr_engine.h`), and resolves which plugin serves a model.
//!
//! Together with the plugins, this crate is where all `unsafe` FFI of the node lives.

pub mod conformance;
mod discovery;
mod gpu;
mod instance;
mod manifest;
mod plugin;
mod registry;
mod speech;
mod status;

pub use discovery::{
    discover, discover_engine, discover_vetted, load_one, DiscoveryOptions, FoundPlugin, PluginState, Vet,
};
pub use gpu::detect_gpu;
pub use instance::{
    EmbedInputs, EngineInstance, FinishReason, InferParams, InferResult, InstanceConfig, ModelSpec, TokenEvent,
    TopLogprob,
};
pub use llmr_engine_abi as abi;
pub use llmr_engine_types::{
    Capability, Constraint, Format, ModelInfo, Sampling, SamplingDefaults, TokenLogprob, UnsetSampling,
};
pub use manifest::{Dependency, GpuBackend, Manifest, ManifestError, KNOWN_FORMATS, KNOWN_MODALITIES, SPEC_RUNTIMES};
pub use plugin::{Plugin, PluginInfo};
pub use registry::{EngineRegistry, ModelRequirements, ResolveError};
pub use speech::{Segment, SynthesizeParams, TranscribeParams, Word};
pub use status::{CallError, EngineStatus};

/// Path of the published JSON Schema of `manifest.json`.
pub const MANIFEST_SCHEMA_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifest.schema.json");
