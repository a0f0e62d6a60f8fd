//! `llmr node`: a node under a router. It registers with the router, sends heartbeats, serves
//! the router's models (synced into the local store) and the store's own, and requires on `/v1`
//! the secret it made at start (the router sends it on proxied requests).

use crate::net::{advertised_url, bind};
use crate::serve::until_stopped;
use crate::{finished, rest_of, Error, STOP_GRACE};
use llmr_cluster::{NodeRegistered, NodeRegistration};
use llmr_node::agent::{new_secret, Agent, AgentConfig};
use llmr_node::{Node, NodeConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What [`ClusterNode::start`] needs.
#[derive(Debug, Clone)]
pub struct ClusterNodeConfig {
    /// The node's settings; its keys are the secret made at start and `api_key`.
    pub node: NodeConfig,
    /// The router's URL (`http://router:8080`).
    pub router: String,
    /// A router API key with the `node` scope.
    pub token: String,
    /// The node's name at the router, stable across restarts.
    pub name: String,
    /// Where the node listens (port 0: a free one).
    pub host: String,
    pub port: u16,
    /// The URL the router reaches this node at; `None`: `http://ADDRESS:PORT` as bound, with the
    /// host name when listening on every address.
    pub advertise: Option<String>,
    /// Also accepted on `/v1`, for clients that reach the node directly.
    pub api_key: Option<String>,
    /// The model store: the router's models are synced into it; its own are served too.
    pub store: PathBuf,
}

/// A node listening, not yet registered: [`ClusterNode::run`] registers it and keeps it
/// reporting. Dropping it starts a graceful stop of its HTTP server without waiting for it.
pub struct ClusterNode {
    addr: SocketAddr,
    agent: Agent,
    stop: watch::Sender<bool>,
    server: Option<JoinHandle<anyhow::Result<()>>>,
}

impl ClusterNode {
    /// Builds the node (discovers the engines; loads no model), listens, and describes the
    /// machine for the registration.
    pub async fn start(config: ClusterNodeConfig) -> Result<ClusterNode, Error> {
        let secret = new_secret();
        let api_keys = std::iter::once(secret.clone()).chain(config.api_key.filter(|k| !k.is_empty())).collect();
        let node = Node::new(NodeConfig { api_keys, ..config.node }).map_err(|e| Error::Node(e.into()))?;
        let listener = bind(&config.host, config.port).await?;
        let addr = listener.local_addr()?;
        let url = config.advertise.unwrap_or_else(|| advertised_url(addr));
        let agent_config = AgentConfig::new(config.router, config.token, config.name, url, secret, config.store);
        let models = node.models().clone();
        let agent = tokio::task::spawn_blocking(move || Agent::new(agent_config, models)).await??;
        let (stop, stopped) = watch::channel(false);
        let server = tokio::spawn(node.serve(listener, until_stopped(stopped)));
        Ok(ClusterNode { addr, agent, stop, server: Some(server) })
    }

    /// The address the node listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the node tells the router about itself (name, URL, machine, runtimes).
    pub fn registration(&self) -> &NodeRegistration {
        self.agent.registration()
    }

    /// Registers with the router (retried while it cannot be reached), tells `on_registered`,
    /// then heartbeats and syncs the router's models. Returns only on a fatal error (the router
    /// refused the token) or when the HTTP server stops by itself; dropping the future stops
    /// the agent (a download in progress is resumed at the next start).
    pub async fn run(&mut self, on_registered: impl FnOnce(&NodeRegistered)) -> Result<(), Error> {
        let agent = &self.agent;
        let work = async move {
            let registered = agent.register().await?;
            on_registered(&registered);
            agent.run(registered).await
        };
        tokio::select! {
            r = work => r.map_err(Error::from),
            r = finished(&mut self.server) => match r {
                Ok(served) => served.map_err(|e| Error::Stopped { what: "the node's HTTP server", source: e.into() }),
                Err(e) => Err(Error::Panicked { what: "the node's HTTP server", source: e }),
            },
        }
    }

    /// Stops the HTTP server after the requests in flight, waiting at most [`STOP_GRACE`].
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(STOP_GRACE, rest_of(self.server.take())).await;
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
