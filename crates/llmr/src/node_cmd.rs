//! `llmr node`: a node under a router (`llmr_serve::ClusterNode` is the wiring). This file
//! parses, prints and handles signals.

use crate::signal::shutdown_signal;
use anyhow::Result;
use clap::Args;
use llmr_node::agent::machine;
use llmr_serve::{ClusterNode, ClusterNodeConfig, ConfigPath, NodeKey, NodeSettings};
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
    #[command(flatten)]
    key: NodeKey,
    #[command(flatten)]
    node: NodeSettings,
    #[command(flatten)]
    config: ConfigPath,
}

pub fn run(args: NodeCmdArgs) -> Result<()> {
    let file = args.config.load()?;
    let node = file.merge(&args.node)?;
    let config = ClusterNodeConfig {
        store: node.store_root()?,
        node: node.node_config()?,
        api_key: file.merge(&args.key)?.api_key,
        router: args.router.clone(),
        token: args.token,
        name: args.name.unwrap_or_else(machine::hostname),
        host: args.host,
        port: args.port,
        advertise: args.advertise,
    };
    let (router, name) = (args.router, config.name.clone());

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(async move {
        let mut node = ClusterNode::start(config).await?;
        let bound = node.addr();
        let outcome = tokio::select! {
            r = node.run(|registered| eprintln!(
                "llmr node listening on http://{bound}, registered with {router} as {name} (id {})",
                registered.node_id
            )) => r,
            () = shutdown_signal() => Ok(()),
        };
        node.stop().await;
        Ok(outcome?)
    });
    // A download running in a blocking thread is not waited for: its partial file is resumed
    // at the next start.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}
