//! The `llmr` binary: parses the command line, starts logging, and calls library crates.

mod engines_cmd;
mod run_cmd;

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
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
