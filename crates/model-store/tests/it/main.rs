//! Behaviour of the model store: the GGUF reader on synthetic and real files, the safetensors
//! rules, name resolution and path safety, and imports. The real models come from
//! `scripts/fetch-models` (cache: $LLMR_MODEL_CACHE or ~/.cache/llmr/models); tests that need a
//! missing one fail and say which to fetch.

mod gguf_synthetic;
mod import;
mod real_files;
mod safetensors;
mod store;
mod support;
