//! The llmr node: serves the models of one machine over the OpenAI API.
//!
//! A request's path (DESIGN.md): `http` parses and validates it with the `openai` crate; the
//! [`ModelManager`] resolves the model (loading it lazily, unloading idle ones under the memory
//! budget); the chat template renders the prompt and the engine counts its tokens (a context
//! overflow is a 400 before any generation); [`admission`] admits it to a slot or queues it
//! (bounded; full is 429); [`generation`] runs the engine and streams tokens back; a client that
//! leaves cancels its generation.
//!
//! Under a router, the [`agent`] registers the node, sends heartbeats and syncs the router's
//! models into the local store and the catalog.

pub mod admission;
pub mod agent;
pub mod cache;
pub mod engine;
pub mod generation;
mod http;
pub mod metrics;
pub mod models;
mod node;

pub use engine::{Engine, EngineSettings, ModelInfo, PluginEngine};
pub use http::health_report;
pub use models::{total_memory_bytes, LoadSnapshot, ModelManager, ModelPolicy};
pub use node::{Node, NodeConfig};
