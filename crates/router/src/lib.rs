//! The llmr router: one OpenAI endpoint in front of many nodes.
//!
//! - [`server`]: the [`Router`] value (opened from a [`config::RouterConfig`], its route table,
//!   serving); [`state`]: the [`RouterState`] every handler shares (it imports no handler).
//! - [`db`]: SQLite state (registered models with their files, nodes, hashed API keys).
//! - [`registration`]: turns `POST /v0/models` into a manifest from the hub's listing and headers.
//! - [`nodes`]: live node table (heartbeats, readiness, in-flight counts); [`balance`] picks one.
//! - [`gateway`]: `/v1/*` validation, proxying, retries; [`admin`]: `/v0/*`.
//! - [`keys`] and [`auth`]: API keys with scopes; [`metrics`]: Prometheus.

#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod balance;
pub mod config;
pub mod cors;
pub mod db;
pub mod gateway;
pub mod keys;
pub mod metrics;
pub mod nodes;
pub mod registration;
pub mod responses;
pub mod server;
pub mod state;

pub use config::{RouterConfig, DEFAULT_RESPONSES_RETENTION};
pub use cors::CorsOrigins;
pub use keys::{KeyRing, Scope};
pub use server::Router;
pub use state::{EmbeddedNode, RouterState};
