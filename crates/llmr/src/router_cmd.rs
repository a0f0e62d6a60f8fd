//! `llmr router`: the OpenAI endpoint in front of the nodes (`llmr node --router URL`).

use crate::signal::shutdown_signal;
use anyhow::{bail, Context, Result};
use clap::Args;
use llmr_router::{CorsOrigins, Router, RouterConfig};
use llmr_serve::{bind, is_loopback};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct RouterArgs {
    #[arg(long, env = "LLMR_HOST", default_value = "127.0.0.1")]
    host: String,
    #[arg(long, env = "LLMR_PORT", default_value_t = 8080)]
    port: u16,
    /// The SQLite database (default ~/.llmr/router.db).
    #[arg(long, env = "LLMR_ROUTER_DB")]
    db: Option<PathBuf>,
    /// Accept nodes without a GPU (the specs make GPUs a requirement; CPU is a fallback).
    #[arg(long)]
    allow_cpu_nodes: bool,
    /// No API keys at all: only on a loopback address.
    #[arg(long)]
    no_auth: bool,
    /// How often nodes heartbeat.
    #[arg(long, default_value_t = 2000)]
    heartbeat_interval_ms: u64,
    /// A node silent this long gets no traffic until it heartbeats again.
    #[arg(long, default_value_t = 6000)]
    heartbeat_timeout_ms: u64,
    /// Largest request body accepted (413 beyond).
    #[arg(long, default_value_t = 16)]
    body_limit_mib: usize,
    /// Web pages allowed to call the API from a browser: exact origins
    /// (`https://app.example.com`), or `*` for any. Default: pages served from this machine.
    #[arg(long, env = "LLMR_CORS_ORIGINS", value_delimiter = ',')]
    cors_origins: Vec<String>,
    /// Days a stored response of /v1/responses is kept (for previous_response_id and GET).
    #[arg(long, env = "LLMR_RESPONSES_RETENTION_DAYS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    responses_retention_days: u32,
}

fn days(n: u32) -> Duration {
    Duration::from_secs(u64::from(n) * 24 * 3600)
}

pub fn db_path(given: Option<PathBuf>) -> Result<PathBuf> {
    match given {
        Some(p) => Ok(p),
        None => RouterConfig::default_db_path().context("no home directory for the router database; pass --db"),
    }
}

pub fn run(args: RouterArgs) -> Result<()> {
    if args.no_auth && !is_loopback(&args.host) {
        bail!("--no-auth is only allowed on a loopback address (got {})", args.host);
    }
    if args.heartbeat_timeout_ms <= args.heartbeat_interval_ms {
        bail!("--heartbeat-timeout-ms must be longer than --heartbeat-interval-ms");
    }
    let mut config = RouterConfig::new(db_path(args.db)?);
    config.require_auth = !args.no_auth;
    config.allow_cpu_nodes = args.allow_cpu_nodes;
    config.heartbeat_interval = Duration::from_millis(args.heartbeat_interval_ms);
    config.heartbeat_timeout = Duration::from_millis(args.heartbeat_timeout_ms);
    config.body_limit = args.body_limit_mib << 20;
    config.cors = CorsOrigins::parse(&args.cors_origins).map_err(|e| anyhow::anyhow!("--cors-origins: {e}"))?;
    config.responses_retention = days(args.responses_retention_days);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let db = config.db_path.clone();
        let router = Router::open(config)?;
        if router.state().config.require_auth && router.state().keys.is_empty() {
            eprintln!(
                "llmr router: no API keys yet; create them with `llmr keys create --db {} --name admin --scope admin` (and --scope api / --scope node)",
                db.display()
            );
        }
        let listener = bind(&args.host, args.port).await?;
        eprintln!("llmr router listening on http://{} (database {})", listener.local_addr()?, db.display());
        router.serve(listener, shutdown_signal()).await
    })
}
