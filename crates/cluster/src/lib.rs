//! The control plane between the router and its nodes (`/v0/*`), as plain serde types.
//!
//! Both sides depend on this crate and on nothing of each other: the router never links an
//! engine, and a node never needs the router's database.
//!
//! - [`manifest`]: what the router fixed at model registration and hands to nodes.
//! - [`node`]: node registration and heartbeats (load and per-model readiness).
//! - [`paths`]: the checks every file path from a manifest or a request goes through.
#![forbid(unsafe_code)]

pub mod manifest;
pub mod node;
pub mod paths;

pub use manifest::{ManifestFile, ModelFormat, ModelManifest, ModelSource, RegisterModel};
pub use node::{
    EngineBenchmark, EngineReport, GpuInfo, Heartbeat, HeartbeatAck, MachineInfo, ModelState, ModelStatus, NodeLoad,
    NodeRegistered, NodeRegistration,
};
pub use paths::{check_model_name, check_relative_path, PathProblem};

/// Header a node sends on its control-plane calls and the router on proxied requests.
pub const AUTHORIZATION: &str = "authorization";
