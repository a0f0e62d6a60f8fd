//! `llmr serve`: the OpenAI-compatible server on this machine: a router and one node in one
//! process, over the same code paths as `llmr router` + `llmr node` (the node listens on a
//! loopback port of its own, registers with the router over HTTP with a secret made at start,
//! and heartbeats; the router validates, routes and proxies). Models registered at the router
//! (`POST /v0/models`) are fetched into the store and served like the store's own.

use crate::net::{bind, loopback_of};
use crate::settings::check_exposure;
use crate::{finished, rest_of, Error, STOP_GRACE};
use llmr_node::agent::{new_secret, Agent, AgentConfig, AgentError, Backoff};
use llmr_node::{Node, NodeConfig};
use llmr_router::{CorsOrigins, EmbeddedNode, Router, RouterConfig, RouterState, Scope};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The model `llmr serve` preloads when none is named: small enough for any machine.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

/// How long [`Serve::start`] waits for the node's first report of its models.
const REPORT_TIMEOUT: Duration = Duration::from_secs(30);

/// What [`Serve::start`] needs; [`ServeSettings::serve_config`](crate::ServeSettings::serve_config)
/// makes one from the settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where clients reach the OpenAI API (port 0: a free one; [`Serve::addr`] tells which).
    pub host: String,
    pub port: u16,
    /// The key clients must send (`None`: none, which only loopback allows unless `no_auth`).
    pub api_key: Option<String>,
    /// Accept a non-loopback address without an API key.
    pub no_auth: bool,
    /// Web pages allowed to call the API from a browser.
    pub cors: CorsOrigins,
    /// How long stored responses of `/v1/responses` are kept.
    pub responses_retention: std::time::Duration,
    /// The embedded node with its models; its key is the secret made at start.
    pub node: NodeConfig,
    /// Where models registered at the router are fetched to.
    pub store: PathBuf,
    /// Also serve the store's own models as they come and go (when no model was named).
    pub scan_store: bool,
    /// Preloaded at start, when the node serves it.
    pub default_model: String,
    /// The router's SQLite database; `None`: `~/.llmr/router.db`.
    pub router_db: Option<PathBuf>,
}

/// A running `llmr serve`: listening, with its node registered and its models routable.
/// Dropping it starts a graceful stop without waiting for it; [`Serve::stop`] waits (bounded).
pub struct Serve {
    addr: SocketAddr,
    models: Vec<String>,
    default_model: String,
    stop: watch::Sender<bool>,
    router: Option<JoinHandle<anyhow::Result<()>>>,
    node: Option<JoinHandle<anyhow::Result<()>>>,
    agent: Option<JoinHandle<Result<(), AgentError>>>,
}

impl Serve {
    /// Starts the node (no model loads yet; the default one starts loading), the router on
    /// `host:port` and the node on a loopback port of its own; returns once the node registered
    /// and its first heartbeat reported its models, so that they are routable.
    pub async fn start(config: ServeConfig) -> Result<Serve, Error> {
        let api_key = config.api_key.filter(|k| !k.is_empty());
        check_exposure(&config.host, api_key.as_deref(), config.no_auth)?;
        let db = match config.router_db {
            Some(db) => db,
            None => RouterConfig::default_db_path().ok_or(Error::NoHome { what: "router database", flag: "--db" })?,
        };
        // The node answers only the router (its secret); clients use the router's key, if any.
        let secret = new_secret();
        let node_token = new_secret();
        let mut router_config = RouterConfig::new(db);
        router_config.require_auth = api_key.is_some();
        router_config.allow_cpu_nodes = true;
        // In-process heartbeats only stop when the process does; the margin absorbs a busy machine.
        router_config.heartbeat_interval = Duration::from_secs(2);
        router_config.heartbeat_timeout = Duration::from_secs(15);
        router_config.body_limit = config.node.body_limit;
        router_config.audio_body_limit = config.node.audio.max_upload_bytes;
        router_config.cors = config.cors;
        router_config.responses_retention = config.responses_retention;
        router_config.fixed_keys.push((node_token.clone(), "embedded node".into(), vec![Scope::Node]));
        if let Some(key) = api_key {
            router_config.fixed_keys.push((key, "llmr serve --api-key".into(), vec![Scope::Api, Scope::Admin]));
        }

        let node = Node::new(NodeConfig { api_keys: vec![secret.clone()], ..config.node })
            .map_err(|e| Error::Node(e.into()))?;
        let names: Vec<String> = node.models().entries().iter().map(|e| e.desc.name.clone()).collect();
        if names.is_empty() {
            return Err(Error::NoEngine);
        }
        let router = Router::open(router_config).map_err(|e| Error::Router(e.into()))?;
        let (m1, m2) = (node.models().clone(), node.models().clone());
        router.embed_node(EmbeddedNode {
            refresh_metrics: Box::new(move || llmr_node::metrics::refresh(&m1)),
            health: Box::new(move || llmr_node::health_report(&m2)),
        });
        let listener = bind(&config.host, config.port).await?;
        let addr = listener.local_addr()?;
        let node_listener = bind("127.0.0.1", 0).await?;
        let node_url = format!("http://{}", node_listener.local_addr()?);
        let router_url = format!("http://{}", loopback_of(addr));
        let mut agent_config = AgentConfig::new(router_url, node_token, "local".into(), node_url, secret, config.store);
        agent_config.scan_store = config.scan_store;
        agent_config.backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_secs(2) };
        let models = node.models().clone();
        let agent = tokio::task::spawn_blocking(move || Agent::new(agent_config, models)).await??;

        let (stop, stopped) = watch::channel(false);
        let default_model = config.default_model;
        let node = tokio::spawn(node_serve(node, node_listener, stopped.clone(), default_model.clone(), names.clone()));
        let state = router.state().clone();
        let router = tokio::spawn(router.serve(listener, until_stopped(stopped)));
        // From here on, a failure stops what started (dropping `serve`).
        let mut serve =
            Serve { addr, models: names, default_model, stop, router: Some(router), node: Some(node), agent: None };
        let registered = agent.register().await?;
        serve.agent = Some(tokio::spawn(async move { agent.run(registered).await }));
        serve.routable(&state).await?;
        Ok(serve)
    }

    /// Listening means routable: waits for the heartbeat that reports the models.
    async fn routable(&self, state: &Arc<RouterState>) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + REPORT_TIMEOUT;
        while !state.nodes.reported_models().iter().any(|m| self.models.contains(m)) {
            if tokio::time::Instant::now() > deadline {
                return Err(Error::NotReported);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// The address the OpenAI API listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The models the node serves (those some engine can run), in the order given.
    pub fn models(&self) -> &[String] {
        &self.models
    }

    /// The model preloaded at start.
    pub fn default_model(&self) -> &str {
        &self.default_model
    }

    /// Resolves when a part stops by itself, which only failures make them do: the router's or
    /// the node's HTTP server, or the node's agent. Cancel-safe (a part seen ending is not
    /// awaited again), so it can race a shutdown signal before [`Serve::stop`].
    pub async fn wait(&mut self) -> Result<(), Error> {
        tokio::select! {
            r = finished(&mut self.router) => served(r).map_err(stopped("the router")),
            r = finished(&mut self.node) => served(r).map_err(stopped("the node's HTTP server")),
            r = finished(&mut self.agent) => match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(Error::Stopped { what: "the embedded node's agent", source: e.into() }),
                Err(e) => Err(Error::Panicked { what: "the embedded node's agent", source: e }),
            },
        }
    }

    /// Stops: the agent at once, the router and the node after the requests in flight, waiting
    /// at most [`STOP_GRACE`] for them (what still runs then ends with the runtime).
    pub async fn stop(mut self) {
        self.signal_stop();
        let (router, node) = (self.router.take(), self.node.take());
        let _ = tokio::time::timeout(STOP_GRACE, async {
            rest_of(router).await;
            rest_of(node).await;
        })
        .await;
    }

    fn signal_stop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(agent) = self.agent.take() {
            agent.abort();
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.signal_stop();
    }
}

fn stopped(what: &'static str) -> impl FnOnce(crate::BoxError) -> Error {
    move |source| Error::Stopped { what, source }
}

/// A server task's outcome: its panic or its error, as one error.
fn served(r: Result<anyhow::Result<()>, tokio::task::JoinError>) -> Result<(), crate::BoxError> {
    match r {
        Ok(r) => r.map_err(Into::into),
        Err(e) => Err(e.into()),
    }
}

/// Serves the node on its private listener after preloading the default model.
async fn node_serve(
    node: Node,
    listener: tokio::net::TcpListener,
    stopped: watch::Receiver<bool>,
    default_model: String,
    names: Vec<String>,
) -> anyhow::Result<()> {
    if names.contains(&default_model) {
        node.preload(&default_model);
    }
    node.serve(listener, until_stopped(stopped)).await
}

/// Resolves once `stopped` turns true (or its sender is gone).
pub(crate) async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}
