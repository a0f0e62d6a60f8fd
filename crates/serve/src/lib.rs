//! `llmr serve` and `llmr node` as values: started from a config, asked for their address,
//! stopped (gracefully, within [`STOP_GRACE`]) or awaited; and their settings.
//!
//! - [`settings`]: one struct per concern ([`NodeSettings`], [`ServeSettings`], [`NodeKey`]),
//!   each a set of flags with env vars (clap) and of keys of one flat TOML file (serde), merged
//!   by one rule ([`ConfigFile::merge`]: flag or env var, then file, then default) and converted
//!   once into what the libraries take ([`NodeSettings::node_config`],
//!   [`ServeSettings::serve_config`]).
//! - [`Serve`]: a router and one node in one process, talking over loopback HTTP exactly as
//!   separate processes do (`llmr serve`).
//! - [`ClusterNode`]: a node under a router (`llmr node`).
//!
//! The `llmr` binary parses the command line, prints, and handles signals; everything it starts
//! is here, so tests start the same thing in process.

#![forbid(unsafe_code)]

mod error;
mod net;
mod node;
mod serve;
pub mod settings;

pub use error::{BoxError, Error};
pub use llmr_router::CorsOrigins;
pub use net::{bind, is_loopback};
pub use node::{ClusterNode, ClusterNodeConfig};
pub use serve::{Serve, ServeConfig, DEFAULT_MODEL};
pub use settings::{ConfigFile, ConfigPath, NodeKey, NodeSettings, ServeSettings};

use std::time::Duration;
use tokio::task::{JoinError, JoinHandle};

/// How long a stop waits for the requests in flight.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// Awaits a task that may end by itself; once it did, the slot is empty, so a later call (or a
/// stop) never polls it again. Pends forever on an empty slot.
async fn finished<T>(task: &mut Option<JoinHandle<T>>) -> Result<T, JoinError> {
    match task {
        Some(handle) => {
            let outcome = handle.await;
            *task = None;
            outcome
        }
        None => std::future::pending().await,
    }
}

/// Awaits what is left of a task: nothing when it already ended.
async fn rest_of<T>(task: Option<JoinHandle<T>>) {
    if let Some(handle) = task {
        let _ = handle.await;
    }
}
