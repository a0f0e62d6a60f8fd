//! `llmr serve`: the OpenAI-compatible server on this machine (router and node in one process).

use crate::config::{self, FileConfig};
use anyhow::{bail, Context, Result};
use clap::Args;
use llmr_engine_host::detect_gpu;
use llmr_model_store::{ModelDescriptor, ModelStore};
use llmr_node::{Node, NodeConfig};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

/// The model `llmr serve` preloads when none is named: small enough for any machine.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on. Anything but loopback requires an API key (or --no-auth).
    #[arg(long, env = "LLMR_HOST")]
    host: Option<String>,
    /// Port (0 picks a free one; the address is printed).
    #[arg(long, env = "LLMR_PORT")]
    port: Option<u16>,
    /// Clients must send `Authorization: Bearer KEY`.
    #[arg(long, env = "LLMR_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Accept a non-loopback address without an API key.
    #[arg(long)]
    no_auth: bool,
    /// A model to serve: a store name, a GGUF path, or ALIAS=PATH. Repeatable; default: the
    /// whole store. The first one is preloaded.
    #[arg(long = "model", short = 'm', env = "LLMR_MODEL", value_delimiter = ',')]
    models: Vec<String>,
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

/// A `--model` value resolved to a descriptor.
fn resolve_model(spec: &str, store: &ModelStore) -> Result<ModelDescriptor> {
    let (alias, target) = match spec.split_once('=') {
        Some((a, t)) if !a.is_empty() && !a.contains('/') => (Some(a), t),
        _ => (None, spec),
    };
    let path = Path::new(target);
    let mut desc = if path.is_file() {
        ModelDescriptor::from_gguf_file(path).with_context(|| format!("reading {target}"))?
    } else {
        store.resolve(target).with_context(|| {
            format!(
                "model `{target}` is neither a file nor in the store {} (llmr pull fetches models)",
                store.root().display()
            )
        })?
    };
    if let Some(alias) = alias {
        desc.name = alias.to_owned();
    }
    Ok(desc)
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

pub fn run(args: ServeArgs) -> Result<()> {
    let file: FileConfig = config::load(args.config.as_deref())?;
    let host = args.host.or(file.host).unwrap_or_else(|| "127.0.0.1".into());
    let port = args.port.or(file.port).unwrap_or(8080);
    let api_key = args.api_key.or(file.api_key).filter(|k| !k.is_empty());
    let no_auth = args.no_auth || file.no_auth.unwrap_or(false);
    if !is_loopback(&host) && api_key.is_none() && !no_auth {
        bail!("refusing to listen on {host} without an API key: set --api-key (or LLMR_API_KEY), or pass --no-auth to accept the risk");
    }
    let store_root = match args.store.or(file.store) {
        Some(p) => p,
        None => ModelStore::default_root().context("no home directory for the model store; pass --store")?,
    };
    let store = ModelStore::open(&store_root)?;
    let specs = if args.models.is_empty() { file.models.unwrap_or_default() } else { args.models };
    let models: Vec<ModelDescriptor> = if specs.is_empty() {
        store.list()
    } else {
        specs.iter().map(|s| resolve_model(s, &store)).collect::<Result<_>>()?
    };
    if models.is_empty() {
        bail!(
            "no models to serve: the store {} is empty; fetch one with `llmr pull`, or name a GGUF file with --model",
            store_root.display()
        );
    }
    let default_model = file
        .default_model
        .or_else(|| (!specs.is_empty()).then(|| models[0].name.clone()))
        .or_else(|| models.iter().find(|m| m.name.starts_with(DEFAULT_MODEL)).map(|m| m.name.clone()))
        .unwrap_or_else(|| models[0].name.clone());
    if detect_gpu().is_none() {
        eprintln!("warning: no GPU found; serving on CPU (fine for development and small models, not recommended for production)");
    }
    let defaults = NodeConfig::default();
    let config = NodeConfig {
        engines_dir: args.engines_dir.or(file.engines_dir).unwrap_or(defaults.engines_dir),
        models,
        slots: args.slots.or(file.slots).unwrap_or(defaults.slots),
        queue_limit: args.queue_limit.or(file.queue_limit).unwrap_or(defaults.queue_limit),
        threads: args.threads.or(file.threads).unwrap_or(defaults.threads),
        context_length: args.ctx_size.or(file.ctx_size).unwrap_or(defaults.context_length),
        memory_budget: args.memory_budget_mib.or(file.memory_budget_mib).map(|m| m << 20),
        cache_bytes: args.cache_mib.or(file.cache_mib).map(|m| m << 20),
        api_key,
        body_limit: args.body_limit_mib.or(file.body_limit_mib).map_or(defaults.body_limit, |m| m << 20),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let node = Node::new(config)?;
        let names: Vec<String> = node.models().entries().map(|e| e.desc.name.clone()).collect();
        if names.is_empty() {
            bail!("none of the models has an engine that can run it (see the warnings above and `llmr engines list`)");
        }
        let addr: SocketAddr = tokio::net::lookup_host((host.as_str(), port))
            .await
            .with_context(|| format!("resolving {host}"))?
            .next()
            .with_context(|| format!("{host} resolves to no address"))?;
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))?;
        let bound = listener.local_addr()?;
        if names.contains(&default_model) {
            node.preload(&default_model);
        }
        eprintln!("llmr listening on http://{bound} (models: {}; default {default_model})", names.join(", "));
        node.serve(listener, shutdown_signal()).await
    })
}

async fn shutdown_signal() {
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
