//! Behaviour of the model store: the GGUF reader on synthetic and real files, the safetensors
//! rules, name resolution and path safety, and imports.

mod gguf_synthetic;
mod real_files;
mod support;
