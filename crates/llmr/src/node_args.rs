//! What `llmr serve` and `llmr node` share: the node's settings (flags and env vars over the
//! config file), the listener, and the shutdown signal.

use crate::config::{self, FileConfig};
use anyhow::{Context, Result};
use clap::Args;
use llmr_model_store::ModelStore;
use llmr_node::NodeConfig;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The node settings: engines, slots, context, memory, cache, store.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The model store (default ~/.llmr/models).
    #[arg(long, env = "LLMR_MODELS")]
    store: Option<PathBuf>,
    #[arg(long, env = "LLMR_ENGINES_DIR")]
    engines_dir: Option<PathBuf>,
    /// Requests each model runs at once.
    #[arg(long, env = "LLMR_SLOTS")]
    slots: Option<u32>,
    /// Requests that may wait per model before the server answers 429.
    #[arg(long, env = "LLMR_QUEUE_LIMIT")]
    queue_limit: Option<usize>,
    /// CPU threads per engine (0: the engine's choice).
    #[arg(long, env = "LLMR_THREADS")]
    threads: Option<u32>,
    /// Context length per request (0: the engine's default).
    #[arg(long, env = "LLMR_CTX_SIZE")]
    ctx_size: Option<u32>,
    /// Memory the loaded models may use (default: 90% of RAM).
    #[arg(long, env = "LLMR_MEMORY_BUDGET_MIB")]
    memory_budget_mib: Option<u64>,
    /// Temperature-0 answer cache (default: 5% of RAM; 0 turns it off).
    #[arg(long, env = "LLMR_CACHE_MIB")]
    cache_mib: Option<usize>,
    /// Largest request body accepted (413 beyond).
    #[arg(long, env = "LLMR_BODY_LIMIT_MIB")]
    body_limit_mib: Option<usize>,
    /// TOML config file (default ~/.llmr/config.toml when present).
    #[arg(long, env = "LLMR_CONFIG")]
    config: Option<PathBuf>,
}

impl NodeArgs {
    /// The config file these settings name, or the default one when present.
    pub fn file(&self) -> Result<FileConfig> {
        config::load(self.config.as_deref())
    }

    pub fn store_root(&self, file: &FileConfig) -> Result<PathBuf> {
        match self.store.clone().or(file.store.clone()) {
            Some(p) => Ok(p),
            None => ModelStore::default_root().context("no home directory for the model store; pass --store"),
        }
    }

    /// The node's configuration, without models or API keys.
    pub fn node_config(&self, file: &FileConfig) -> NodeConfig {
        let defaults = NodeConfig::default();
        NodeConfig {
            engines_dir: self.engines_dir.clone().or(file.engines_dir.clone()).unwrap_or(defaults.engines_dir),
            models: Vec::new(),
            slots: self.slots.or(file.slots).unwrap_or(defaults.slots),
            queue_limit: self.queue_limit.or(file.queue_limit).unwrap_or(defaults.queue_limit),
            threads: self.threads.or(file.threads).unwrap_or(defaults.threads),
            context_length: self.ctx_size.or(file.ctx_size).unwrap_or(defaults.context_length),
            memory_budget: self.memory_budget_mib.or(file.memory_budget_mib).map(|m| m << 20),
            cache_bytes: self.cache_mib.or(file.cache_mib).map(|m| m << 20),
            api_keys: Vec::new(),
            body_limit: self.body_limit_mib.or(file.body_limit_mib).map_or(defaults.body_limit, |m| m << 20),
        }
    }
}

/// Listens on `host:port` (port 0: a free one).
pub async fn bind(host: &str, port: u16) -> Result<tokio::net::TcpListener> {
    let addr: SocketAddr = tokio::net::lookup_host((host, port))
        .await
        .with_context(|| format!("resolving {host}"))?
        .next()
        .with_context(|| format!("{host} resolves to no address"))?;
    tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))
}

/// Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("llmr: shutting down");
}
