//! The llmr node: serves the models of one machine over the OpenAI API.
//!
//! A request's path: `http` parses and validates it with the `openai` crate; one pipeline
//! (`http/pipeline.rs`) serves every generating endpoint: the [`ModelManager`] resolves the model
//! (loading it lazily, unloading idle ones under the memory budget); the endpoint builds the
//! prompt ([`prompt`] renders chat templates) and the engine counts its tokens (a context overflow
//! is a 400 before any generation); [`admission`] admits it to a slot or queues it (bounded; full
//! is 429); [`generation`] runs the engine and streams tokens back; the endpoint's encoder writes
//! them as JSON or SSE; a client that leaves cancels its generation. The core speaks
//! [`NodeError`]; the HTTP layer maps it to OpenAI errors in one place.
//!
//! Under a router, the [`agent`] registers the node, sends heartbeats and syncs the router's
//! models into the local store and the catalog.

#![forbid(unsafe_code)]

pub mod admission;
pub mod agent;
pub mod answer;
pub mod cache;
pub mod control;
pub mod devices;
pub mod engine;
mod error;
pub mod generation;
mod http;
pub mod memory_guard;
pub mod metrics;
pub mod modality_gate;
pub mod models;
mod node;
pub mod plugin_reload;
pub mod prompt;
pub mod slow_loop;
pub mod thinking_budget;

pub use devices::{Device, DeviceInventory};
pub use engine::{Engine, EngineIsolation, EngineSettings, IsolatedEngine, PluginEngine, DEFAULT_WATCHDOG};
pub use error::NodeError;
pub use http::health_report;
pub use llmr_engine_worker::WorkerCommand;
pub use modality_gate::GateMode;
pub use models::{total_memory_bytes, LoadSnapshot, ModelManager, ModelPolicy, RestartPolicy};
pub use node::{AudioLimits, Node, NodeConfig};
