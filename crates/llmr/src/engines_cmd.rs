//! `llmr engines list` and `llmr engines check`.

use clap::{Args, Subcommand};
use llmr_engine_host::conformance::{check_plugin, CheckOptions, Outcome};
use llmr_engine_host::{detect_gpu, discover, DiscoveryOptions, EngineRegistry, PluginState};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum EnginesCommand {
    /// List every plugin found: id, version, backends, runtimes, formats, and whether it loaded.
    List(ListArgs),
    /// Run the conformance suite on one plugin folder (the one holding manifest.json).
    Check(CheckArgs),
}

#[derive(Args)]
pub struct ListArgs {
    /// Plugin root holding <engine_id>/<gpu_backend>/manifest.json.
    #[arg(long, env = "LLMR_ENGINES_DIR", default_value = "engines")]
    dir: PathBuf,
    /// Refuse CPU plugins (the specs' fallback) even when no GPU is found.
    #[arg(long)]
    no_cpu: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct CheckArgs {
    /// Folder holding the plugin's manifest.json and shared library.
    plugin_dir: PathBuf,
    /// Model file for the checks that need one (load, infer, cancel, embed...).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt for the generation checks.
    #[arg(long)]
    prompt: Option<String>,
    /// Threads for the engine instance (0 = the engine's default).
    #[arg(long, default_value_t = 0)]
    threads: u32,
}

pub fn run(cmd: EnginesCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        EnginesCommand::List(args) => list(args),
        EnginesCommand::Check(args) => check(args),
    }
}

fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    if !args.dir.is_dir() {
        anyhow::bail!("plugin directory {} does not exist", args.dir.display());
    }
    let options = DiscoveryOptions { gpu: detect_gpu(), allow_cpu: !args.no_cpu };
    let mut registry = EngineRegistry::new();
    let found = discover(&args.dir, &options, &mut registry);
    let rows: Vec<serde_json::Value> = found
        .iter()
        .map(|f| {
            let m = f.manifest.as_ref();
            let (state, reason) = match &f.state {
                PluginState::Loaded(_) => ("loaded", String::new()),
                PluginState::Refused(r) => ("refused", r.clone()),
                PluginState::Skipped(r) => ("skipped", r.clone()),
            };
            serde_json::json!({
                "id": m.map(|m| m.id.clone()).unwrap_or_else(|| f.folder_id()),
                "version": m.map(|m| m.version.to_string()),
                "folder": f.folder_backend(),
                "backends": m.map(|m| m.gpu_backends.iter().map(|b| b.as_str()).collect::<Vec<_>>()),
                "runtimes": m.map(|m| m.runtimes.clone()),
                "formats": m.map(|m| m.formats.clone()),
                "state": state,
                "reason": reason,
                "path": f.dir.display().to_string(),
            })
        })
        .collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    let gpu = options.gpu.map_or("none".to_string(), |g| g.to_string());
    println!(
        "plugins in {} (GPU: {gpu}, CPU plugins {})",
        args.dir.display(),
        if options.allow_cpu { "allowed" } else { "refused" }
    );
    println!(
        "{:<14} {:<9} {:<8} {:<22} {:<20} {:<14} STATE",
        "ID", "VERSION", "FOLDER", "BACKENDS", "RUNTIMES", "FORMATS"
    );
    let join = |v: &serde_json::Value| {
        v.as_array().map(|a| a.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(",")).unwrap_or("-".into())
    };
    for row in &rows {
        let state = match row["reason"].as_str() {
            Some(r) if !r.is_empty() => {
                format!("{}: {r}", row["state"].as_str().unwrap_or_default())
            }
            _ => row["state"].as_str().unwrap_or_default().to_string(),
        };
        println!(
            "{:<14} {:<9} {:<8} {:<22} {:<20} {:<14} {state}",
            row["id"].as_str().unwrap_or("?"),
            row["version"].as_str().unwrap_or("-"),
            row["folder"].as_str().unwrap_or("?"),
            join(&row["backends"]),
            join(&row["runtimes"]),
            join(&row["formats"]),
        );
    }
    if rows.is_empty() {
        println!("(no plugin folders found)");
    }
    Ok(ExitCode::SUCCESS)
}

fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let options = CheckOptions { model: args.model, format: None, prompt: args.prompt, threads: args.threads };
    let checks = check_plugin(&args.plugin_dir, &options);
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for c in &checks {
        let tag = match &c.outcome {
            Outcome::Pass => {
                passed += 1;
                "PASS"
            }
            Outcome::Fail(_) => {
                failed += 1;
                "FAIL"
            }
            Outcome::Skip(_) => {
                skipped += 1;
                "SKIP"
            }
        };
        println!("{tag} {:<34} {}", c.name, c.detail);
    }
    if skipped > 0 {
        println!("{passed} passed, {failed} failed, {skipped} skipped");
    } else {
        println!("{passed} passed, {failed} failed");
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
