//! `llmr serve`: the OpenAI-compatible server on this machine: a router and one node in one
//! process, over the same code paths as `llmr router` + `llmr node` (the node listens on a
//! loopback port of its own, registers with the router over HTTP and heartbeats; the router
//! validates, routes and proxies). Models registered at the router (`POST /v0/models`) are
//! fetched into the store and served like the store's own.

use crate::node_args::{bind, NodeArgs};
// `llmr router` stops on the same signals.
pub(crate) use crate::node_args::shutdown_signal;
use anyhow::{bail, Context, Result};
use clap::Args;
use llmr_engine_host::detect_gpu;
use llmr_model_store::{ModelDescriptor, ModelStore};
use llmr_node::agent::{new_secret, Agent, AgentConfig, Backoff};
use llmr_node::{Node, NodeConfig};
use llmr_router::{EmbeddedNode, Router, RouterConfig, Scope};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// The router's SQLite database (default ~/.llmr/router.db).
    #[arg(long = "router-db", env = "LLMR_ROUTER_DB")]
    router_db: Option<PathBuf>,
    #[command(flatten)]
    node: NodeArgs,
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

pub(crate) fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

pub fn run(args: ServeArgs) -> Result<()> {
    let file = args.node.file()?;
    let store_root = args.node.store_root(&file)?;
    let node_config = args.node.node_config(&file);
    let host = args.host.or(file.host).unwrap_or_else(|| "127.0.0.1".into());
    let port = args.port.or(file.port).unwrap_or(8080);
    let api_key = args.api_key.or(file.api_key).filter(|k| !k.is_empty());
    let no_auth = args.no_auth || file.no_auth.unwrap_or(false);
    if !is_loopback(&host) && api_key.is_none() && !no_auth {
        bail!("refusing to listen on {host} without an API key: set --api-key (or LLMR_API_KEY), or pass --no-auth to accept the risk");
    }
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
    // The node answers only the router (its secret); clients use the router's key, if any.
    let secret = new_secret();
    let node_token = new_secret();
    let body_limit = node_config.body_limit;
    let config = NodeConfig { models, api_keys: vec![secret.clone()], ..node_config };
    let mut router_config = RouterConfig::new(crate::router_cmd::db_path(args.router_db)?);
    router_config.require_auth = api_key.is_some();
    router_config.allow_cpu_nodes = true;
    // In-process heartbeats only stop when the process does; the margin absorbs a busy machine.
    router_config.heartbeat_interval = Duration::from_secs(2);
    router_config.heartbeat_timeout = Duration::from_secs(15);
    router_config.body_limit = body_limit;
    router_config.fixed_keys.push((node_token.clone(), "embedded node".into(), vec![Scope::Node]));
    if let Some(key) = api_key {
        router_config.fixed_keys.push((key, "llmr serve --api-key".into(), vec![Scope::Api, Scope::Admin]));
    }
    let scan_store = specs.is_empty();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let node = Node::new(config)?;
        let names: Vec<String> = node.models().entries().iter().map(|e| e.desc.name.clone()).collect();
        if names.is_empty() {
            bail!("none of the models has an engine that can run it (see the warnings above and `llmr engines list`)");
        }
        let router = Router::open(router_config)?;
        let (m1, m2) = (node.models().clone(), node.models().clone());
        router.embed_node(EmbeddedNode {
            refresh_metrics: Box::new(move || llmr_node::metrics::refresh(&m1)),
            health: Box::new(move || llmr_node::health_report(&m2)),
        });
        let listener = bind(&host, port).await?;
        let bound = listener.local_addr()?;
        let node_listener = bind("127.0.0.1", 0).await?;
        let node_url = format!("http://{}", node_listener.local_addr()?);
        let router_url = format!("http://{}", loopback_of(bound));
        let mut agent_config =
            AgentConfig::new(router_url, node_token, "local".into(), node_url, secret, store_root.clone());
        agent_config.scan_store = scan_store;
        agent_config.backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_secs(2) };
        let models = node.models().clone();
        let agent = tokio::task::spawn_blocking(move || Agent::new(agent_config, models)).await??;

        let (stop, stopped) = tokio::sync::watch::channel(false);
        let stopped_node = stopped.clone();
        let mut node_server = tokio::spawn(node_serve(node, node_listener, stopped_node, default_model.clone(), names.clone()));
        let state = router.state().clone();
        let mut stopped_router = stopped.clone();
        let mut router_server = tokio::spawn(router.serve(listener, async move {
            let _ = stopped_router.wait_for(|s| *s).await;
        }));
        let registered = agent.register().await?;
        let mut agent_run = tokio::spawn(async move { agent.run(registered).await });
        // Listening means routable: wait for the heartbeat that reports the models.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !state.nodes.reported_models().iter().any(|m| names.contains(m)) {
            if tokio::time::Instant::now() > deadline {
                bail!("the embedded node did not report its models to the router within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        eprintln!("llmr listening on http://{bound} (models: {}; default {default_model})", names.join(", "));
        let outcome = tokio::select! {
            () = shutdown_signal() => Ok(()),
            r = &mut router_server => r.map_err(anyhow::Error::from).and_then(|r| r).context("the router stopped"),
            r = &mut node_server => r.map_err(anyhow::Error::from).and_then(|r| r).context("the node's HTTP server stopped"),
            r = &mut agent_run => match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(anyhow::Error::from(e).context("the embedded node's agent stopped")),
                Err(e) => Err(anyhow::Error::from(e).context("the embedded node's agent panicked")),
            },
        };
        let _ = stop.send(true);
        agent_run.abort();
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            let _ = router_server.await;
            let _ = node_server.await;
        })
        .await;
        outcome
    })
}

/// Serves the node on its private listener after preloading the default model.
async fn node_serve(
    node: Node,
    listener: tokio::net::TcpListener,
    mut stopped: tokio::sync::watch::Receiver<bool>,
    default_model: String,
    names: Vec<String>,
) -> Result<()> {
    if names.contains(&default_model) {
        node.preload(&default_model);
    }
    node.serve(listener, async move {
        let _ = stopped.wait_for(|s| *s).await;
    })
    .await
}

/// Where this process reaches its own router: the bound port on loopback when bound to every
/// address, else the bound address itself.
fn loopback_of(bound: SocketAddr) -> SocketAddr {
    match bound.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::from(([127, 0, 0, 1], bound.port())),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, bound.port())),
        _ => bound,
    }
}
