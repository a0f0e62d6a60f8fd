//! Why settings could not be read, or `llmr serve` / `llmr node` could not start or stopped.
//!
//! Messages name no cause themselves: a caller prints the chain (`{:#}` of an `anyhow::Error`),
//! which gives `the router stopped: ...` as the binary always printed it.

use llmr_model_store::StoreError;
use llmr_node::agent::AgentError;
use std::net::SocketAddr;
use std::path::PathBuf;

/// An error of another library crate that reports with `anyhow` (the node, the router).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading config file {}", path.display())]
    ConfigRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {}", path.display())]
    ConfigParse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    /// A flag that cannot go through the merge (a path that is not UTF-8).
    #[error("merging the settings")]
    Merge(#[source] serde_json::Error),
    #[error("{name}: {message}")]
    Setting { name: &'static str, message: String },
    #[error("no home directory for the {what}; pass {flag}")]
    NoHome { what: &'static str, flag: &'static str },
    #[error("refusing to listen on {host} without an API key: set --api-key (or LLMR_API_KEY), or pass --no-auth to accept the risk")]
    Exposed { host: String },
    #[error(transparent)]
    Store(Box<StoreError>),
    #[error("reading {spec}")]
    ModelFile {
        spec: String,
        #[source]
        source: Box<StoreError>,
    },
    #[error("model `{spec}` is neither a file nor in the store {} (llmr pull fetches models)", store.display())]
    ModelNotFound {
        spec: String,
        store: PathBuf,
        #[source]
        source: Box<StoreError>,
    },
    #[error("no models to serve: the store {} is empty; fetch one with `llmr pull`, or name a GGUF file with --model", store.display())]
    NoModels { store: PathBuf },
    #[error("none of the models has an engine that can run it (see the warnings above and `llmr engines list`)")]
    NoEngine,
    /// The node could not be built (no engine plugin, ...).
    #[error(transparent)]
    Node(BoxError),
    /// The router's database could not be opened.
    #[error(transparent)]
    Router(BoxError),
    #[error("resolving {host}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    #[error("listening on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The agent could not start, or the router refused the node (`llmr node`).
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
    #[error("the embedded node did not report its models to the router within 30 s")]
    NotReported,
    /// A part that runs until stopped ended by itself.
    #[error("{what} stopped")]
    Stopped {
        what: &'static str,
        #[source]
        source: BoxError,
    },
    #[error("{what} panicked")]
    Panicked {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}
