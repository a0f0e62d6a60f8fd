//! Behaviour of the tool-call parser per format, streamed and whole, and detection on real chat
//! templates (which need `scripts/fetch-models qwen2.5 smollm2`).

mod hermes;
mod llama3;
mod mistral;
mod plain_json;
mod real_templates;
mod split_invariance;
mod streaming;
mod support;
