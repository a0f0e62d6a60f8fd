//! `llmr node`: a node under a router. It registers with the router, sends heartbeats, serves
//! the router's models (synced into the local store) and the store's own, and requires on
//! `/v1` the secret it made at start (the router sends it on proxied requests).

use crate::node_args::{bind, shutdown_signal, NodeArgs};
use anyhow::{Context, Result};
use clap::Args;
use llmr_node::agent::{machine, new_secret, Agent, AgentConfig};
use llmr_node::Node;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct NodeCmdArgs {
    /// The router's URL (`http://router:8080`).
    #[arg(long, env = "LLMR_ROUTER")]
    router: String,
    /// A router API key with the `node` scope.
    #[arg(long, env = "LLMR_NODE_TOKEN", hide_env_values = true)]
    token: String,
    /// The node's name at the router, stable across restarts (default: the host name).
    #[arg(long, env = "LLMR_NODE_NAME")]
    name: Option<String>,
    /// Address to listen on. `/v1` always requires the router's secret (or --api-key).
    #[arg(long, env = "LLMR_NODE_HOST", default_value = "127.0.0.1")]
    host: String,
    /// Port (0 picks a free one).
    #[arg(long, env = "LLMR_NODE_PORT", default_value_t = 0)]
    port: u16,
    /// The URL the router reaches this node at (default: http://ADDRESS:PORT as bound, with the
    /// host name when listening on every address).
    #[arg(long, env = "LLMR_ADVERTISE")]
    advertise: Option<String>,
    /// Also accept this key on `/v1` (for clients that reach the node directly).
    #[arg(long, env = "LLMR_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    #[command(flatten)]
    node: NodeArgs,
}

/// `http://<bound address>`, or the host name in place of an unspecified address (0.0.0.0).
fn advertised_url(bound: SocketAddr) -> String {
    if bound.ip().is_unspecified() {
        format!("http://{}:{}", machine::hostname(), bound.port())
    } else {
        format!("http://{bound}")
    }
}

pub fn run(args: NodeCmdArgs) -> Result<()> {
    let file = args.node.file()?;
    let store = args.node.store_root(&file)?;
    let secret = new_secret();
    let api_key = args.api_key.or(file.api_key.clone()).filter(|k| !k.is_empty());
    let mut config = args.node.node_config(&file);
    config.api_keys = std::iter::once(secret.clone()).chain(api_key).collect();
    let name = args.name.unwrap_or_else(machine::hostname);
    let router = args.router;

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(async move {
        let node = Node::new(config)?;
        let listener = bind(&args.host, args.port).await?;
        let bound = listener.local_addr()?;
        let url = args.advertise.unwrap_or_else(|| advertised_url(bound));
        let agent_config = AgentConfig::new(router.clone(), args.token, name.clone(), url, secret, store);
        let models = node.models().clone();
        let agent = tokio::task::spawn_blocking(move || Agent::new(agent_config, models)).await??;

        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut server = tokio::spawn(node.serve(listener, async move {
            let _ = stopped.await;
        }));
        let agent_work = async {
            let registered = agent.register().await?;
            eprintln!(
                "llmr node listening on http://{bound}, registered with {router} as {name} (id {})",
                registered.node_id
            );
            agent.run(registered).await
        };
        let outcome = tokio::select! {
            result = agent_work => result.map_err(anyhow::Error::from),
            result = &mut server => match result {
                Ok(served) => served.context("the node's HTTP server stopped"),
                Err(e) => Err(e).context("the node's HTTP server panicked"),
            },
            () = shutdown_signal() => Ok(()),
        };
        let _ = stop.send(());
        if !server.is_finished() {
            let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        }
        outcome
    });
    // A download running in a blocking thread is not waited for: its partial file is resumed
    // at the next start.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}
