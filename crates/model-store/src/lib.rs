//! The node's local model store: which models are on disk, in which format, and what the engine
//! registry needs to pick an engine for them (spec 003's ModelStorage).
//!
//! - [`gguf`] reads a GGUF file's header and metadata without touching tensor data.
//! - The safetensors rules of spec 003 decide a safetensors directory's primary file.
//! - [`ModelStore`] maps names (`model`, `org/model`, `model:QUANT`) to model directories under
//!   one root, refusing any name that could reach outside it, and imports GGUF files atomically.
//! - [`ModelDescriptor`] is the result: format, primary file, architecture, quantization,
//!   context length, projector, runtime and capabilities.
#![forbid(unsafe_code)]

mod descriptor;
mod error;
pub mod gguf;
mod import;
mod layout;
mod name;
mod safetensors;
mod speech;
mod store;

pub use descriptor::{runtime_for, Capability, Format, ModelDescriptor};
pub use error::StoreError;
pub use layout::{is_gguf, is_mmproj, is_model_dir, split_part, split_part_name};
pub use name::{ModelName, ModelRef, NameError, NameProblem, MAX_NAME_LEN};
pub use safetensors::SafetensorsError;
pub use speech::is_ggml_file;
pub use store::ModelStore;
