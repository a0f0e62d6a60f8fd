//! The native plugin through the host, as a node drives it. Needs the release plugin beside this
//! test binary (`cargo test --release -p llmr-native-engine`) and the models of `scripts/fetch-models
//! smollm2-hf smollm2-f16 gemma3-hf gemma3-f16 qwen2.5-hf qwen2.5-f16 shakespeare` (scripts/test
//! does both); the agreement and embedding tests also need the release llama.cpp plugin (`cargo
//! test --release -p llmr-llama-cpp -p llmr-native-engine` builds both).

mod agreement;
mod bad_input;
mod constrained;
#[cfg(feature = "cuda")]
mod cuda;
mod embeddings;
mod goldens;
mod gpt_oss_chat;
mod kv_levels;
mod kv_policy;
mod kv_retrieval;
mod random_checkpoint;
mod real_models;
mod support;
