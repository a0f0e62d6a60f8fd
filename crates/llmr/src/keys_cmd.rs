//! `llmr keys`: API keys of a router, written straight into its database (a running router sees
//! a new key at its first use).

use crate::router_cmd::db_path;
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use llmr_router::db::Db;
use llmr_router::{KeyRing, Scope};
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Create a key and print it (shown only this once; the router stores its hash).
    Create(CreateArgs),
    /// List keys (never the secrets).
    List(DbArg),
    /// Revoke a key by id.
    Revoke {
        id: String,
        #[command(flatten)]
        db: DbArg,
    },
}

#[derive(Args, Debug)]
pub struct DbArg {
    /// The router's SQLite database (default ~/.llmr/router.db).
    #[arg(long, env = "LLMR_ROUTER_DB")]
    db: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    #[arg(long)]
    name: String,
    /// api (the OpenAI API), node (node registration), admin (everything). Repeatable.
    #[arg(long = "scope", required = true)]
    scopes: Vec<String>,
    #[command(flatten)]
    db: DbArg,
}

pub fn run(cmd: KeysCommand) -> Result<()> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    match cmd {
        KeysCommand::Create(args) => {
            let scopes = args
                .scopes
                .iter()
                .map(|s| Scope::parse(s).ok_or_else(|| anyhow::anyhow!("unknown scope '{s}' (api, node, admin)")))
                .collect::<Result<Vec<_>>>()?;
            let db = Db::open(&db_path(args.db.db)?)?;
            let key = KeyRing::load(&db)?.create(&db, &args.name, &scopes, now)?;
            eprintln!("created key {} ({})", key.id, scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "));
            println!("{}", key.secret);
        }
        KeysCommand::List(args) => {
            let db = Db::open(&db_path(args.db)?)?;
            for k in db.keys()? {
                let state = if k.revoked { "revoked" } else { "active" };
                println!("{}\t{}\t{}…\t{}\t{state}", k.id, k.name, k.prefix, k.scopes.join(","));
            }
        }
        KeysCommand::Revoke { id, db } => {
            let db = Db::open(&db_path(db.db)?)?;
            if !KeyRing::load(&db)?.revoke(&db, &id, now)? {
                bail!("no active key '{id}'");
            }
            eprintln!("revoked {id}");
        }
    }
    Ok(())
}
