//! `llmr run MODEL PROMPT`: one chat turn against a local model, streamed to the terminal.
//!
//! The same path a node request takes, without HTTP: the model store describes the file, the
//! registry picks the plugin from the model's own architecture, the model's chat template renders
//! the message, and the plugin streams tokens.

use anyhow::{bail, Context, Result};
use clap::Args;
use llmr_chat_template::{ChatTemplates, Message, RenderInput, SpecialTokens};
use llmr_engine_host::{
    abi, detect_gpu, discover, DiscoveryOptions, EngineInstance, EngineRegistry, InferParams, InstanceConfig,
    ModelRequirements, ModelSpec,
};
use llmr_model_store::{ModelDescriptor, ModelStore};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct RunArgs {
    /// A GGUF file, or a model name in the local store (`~/.llmr/models`).
    model: String,
    /// The user message.
    prompt: String,
    /// System message.
    #[arg(long)]
    system: Option<String>,
    #[arg(long, default_value_t = 256)]
    max_tokens: u32,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// CPU threads (0 = the engine's default).
    #[arg(long, default_value_t = 0)]
    threads: u32,
    #[arg(long, env = "LLMR_ENGINES_DIR", default_value = "engines")]
    engines_dir: PathBuf,
}

fn describe(model: &str) -> Result<ModelDescriptor> {
    let path = Path::new(model);
    if path.is_file() {
        return ModelDescriptor::from_gguf_file(path).with_context(|| format!("reading {model}"));
    }
    let root = ModelStore::default_root().context("no home directory for the model store")?;
    ModelStore::open(root)?
        .resolve(model)
        .with_context(|| format!("model {model:?} is neither a file nor in the store"))
}

pub fn run(args: RunArgs) -> Result<()> {
    let desc = describe(&args.model)?;
    let gpu = detect_gpu();
    if gpu.is_none() {
        eprintln!("warning: no GPU found; running on CPU (supported for development, not recommended for serving)");
    }
    let mut registry = EngineRegistry::new();
    discover(&args.engines_dir, &DiscoveryOptions { gpu, allow_cpu: true }, &mut registry);
    if registry.plugins().is_empty() {
        bail!(
            "no engine plugin loaded from {} (build and install them with scripts/install-engines; `llmr engines list` says why a plugin was refused)",
            args.engines_dir.display()
        );
    }
    let format = desc.format.as_str();
    let plugin = registry.resolve(&ModelRequirements {
        runtime: Some(&desc.runtime),
        format,
        architecture: &desc.architecture,
        scores: None,
    })?;
    let engine =
        EngineInstance::create(&plugin, &InstanceConfig { slots: 1, threads: args.threads, ..Default::default() })?;
    let started = Instant::now();
    engine.load_model(&ModelSpec {
        model_id: desc.name.clone(),
        format: abi::LLMR_FORMAT_GGUF,
        model_dir: desc.model_dir.display().to_string(),
        primary_file: desc.primary_file.display().to_string(),
        architecture: Some(desc.architecture.clone()),
        quantization: desc.quantization.clone(),
        ..Default::default()
    })?;
    let info = engine.model_info(&desc.name)?;
    if !info["capabilities"].as_array().is_some_and(|c| c.iter().any(|x| x == "text")) {
        bail!("{} is an embedding model; it cannot chat", desc.name);
    }
    let text = |key: &str| info[key].as_str().map(str::to_owned);
    let templates = ChatTemplates::from_sources(
        text("chat_template").as_deref(),
        None,
        SpecialTokens { bos_token: text("bos_token"), eos_token: text("eos_token") },
    )?;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message::system(system.clone()));
    }
    messages.push(Message::user(args.prompt.clone()));
    let prompt = templates.render(&RenderInput::new(&messages, true))?;
    let mut params = InferParams::greedy(1, &desc.name, &prompt);
    params.max_tokens = Some(args.max_tokens);
    params.temperature = args.temperature;
    params.seed = args.seed;
    // The template already wrote any BOS it wants.
    params.add_bos = false;
    let mut out = std::io::stdout().lock();
    let res = engine.infer(&params, |t| {
        let _ = out.write_all(t.text.as_bytes());
        let _ = out.flush();
        true
    })?;
    writeln!(out)?;
    eprintln!(
        "[{} via {}: {} prompt tokens, {} generated ({:?}), {:.0} ms to first token from start, {:.1} tok/s]",
        desc.name,
        plugin.id(),
        res.prompt_tokens,
        res.completion_tokens,
        res.finish_reason,
        (started.elapsed().as_secs_f64() - res.generation_ns as f64 / 1e9) * 1e3,
        res.completion_tokens.saturating_sub(1) as f64 / (res.generation_ns.max(1) as f64 / 1e9),
    );
    Ok(())
}
