//! The `llmr` binary: parses the command line, starts logging, and calls library crates.

#![forbid(unsafe_code)]

mod chat_cmd;
mod engines_cmd;
mod keys_cmd;
mod list_cmd;
mod node_cmd;
mod pull_cmd;
mod router_cmd;
mod run_cmd;
mod serve_cmd;
mod signal;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(name = "llmr", version, about = "Self-hosted OpenAI-compatible LLM serving with engine plugins")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect and test engine plugins.
    #[command(subcommand)]
    Engines(engines_cmd::EnginesCommand),
    /// Answer one chat message with a local model, streamed to the terminal.
    Run(run_cmd::RunArgs),
    /// Serve models over the OpenAI API on this machine.
    Serve(serve_cmd::ServeArgs),
    /// Run a node under a router: register, report, and serve the router's models.
    Node(node_cmd::NodeCmdArgs),
    /// Run the router: one OpenAI endpoint in front of the nodes.
    Router(router_cmd::RouterArgs),
    /// Manage the router's API keys.
    #[command(subcommand)]
    Keys(keys_cmd::KeysCommand),
    /// Download a GGUF model from a Hugging Face compatible hub (or import a local file) into the store.
    Pull(pull_cmd::PullArgs),
    /// List the models in the local store.
    List(list_cmd::ListArgs),
    /// Chat in the terminal with a model on a running llmr (or any OpenAI-compatible) server.
    Chat(chat_cmd::ChatArgs),
    /// One engine plugin with one model, for a node over its standard input (a node starts it).
    #[command(hide = true)]
    EngineWorker,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("LLMR_LOG").unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Engines(cmd) => engines_cmd::run(cmd),
        Command::Run(args) => run_cmd::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Serve(args) => serve_cmd::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Node(args) => node_cmd::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Router(args) => router_cmd::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Keys(cmd) => keys_cmd::run(cmd).map(|()| std::process::ExitCode::SUCCESS),
        Command::Pull(args) => pull_cmd::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::List(args) => list_cmd::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Chat(args) => chat_cmd::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::EngineWorker => Ok(std::process::ExitCode::from(llmr_engine_worker::serve_stdin() as u8)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
