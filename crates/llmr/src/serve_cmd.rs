//! `llmr serve`: the OpenAI-compatible server on this machine (a router and one node in one
//! process; `llmr_serve::Serve` is the wiring). This file parses, prints and handles signals.

use crate::signal::shutdown_signal;
use anyhow::Result;
use clap::Args;
use llmr_engine_host::detect_gpu;
use llmr_serve::{ConfigPath, NodeSettings, Serve, ServeSettings};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    serve: ServeSettings,
    /// The router's SQLite database (default ~/.llmr/router.db).
    #[arg(long = "router-db", env = "LLMR_ROUTER_DB")]
    router_db: Option<PathBuf>,
    #[command(flatten)]
    node: NodeSettings,
    #[command(flatten)]
    config: ConfigPath,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let file = args.config.load()?;
    let node = file.merge(&args.node)?;
    let config = file.merge(&args.serve)?.serve_config(&node, args.router_db)?;
    if detect_gpu().is_none() {
        eprintln!("warning: no GPU found; serving on CPU (fine for development and small models, not recommended for production)");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let mut server = Serve::start(config).await?;
        eprintln!(
            "llmr listening on http://{} (models: {}; default {})",
            server.addr(),
            server.models().join(", "),
            server.default_model()
        );
        let outcome = tokio::select! {
            () = shutdown_signal() => Ok(()),
            r = server.wait() => r,
        };
        server.stop().await;
        Ok(outcome?)
    })
}
