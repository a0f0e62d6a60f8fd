//! `llmr run MODEL PROMPT`: one chat turn against a local model, streamed to the terminal.
//!
//! The node's own path without HTTP: the node's catalog picks the plugin from the model's own
//! metadata and loads it, the model's chat template renders the message, and the generation
//! streams tokens.

use anyhow::{bail, Context, Result};
use clap::Args;
use llmr_engine_host::{detect_gpu, Sampling};
use llmr_model_store::{ModelDescriptor, ModelStore};
use llmr_node::generation::{GenEvent, GenerationInput};
use llmr_node::prompt::render_chat;
use llmr_node::{Node, NodeConfig};
use llmr_openai::{ChatMessage, ChatRequest, MessageContent, Role, ToolChoice};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct RunArgs {
    /// A GGUF file, a safetensors model folder, or a model name in the local store (`~/.llmr/models`).
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
    if path.is_file() || path.join("config.json").is_file() {
        return ModelDescriptor::from_path(path).with_context(|| format!("reading {model}"));
    }
    let root = ModelStore::default_root().context("no home directory for the model store")?;
    ModelStore::open(root)?
        .resolve(model)
        .with_context(|| format!("model {model:?} is neither a file nor in the store"))
}

fn message(role: Role, text: &str) -> ChatMessage {
    ChatMessage {
        role,
        content: Some(MessageContent::Text(text.to_owned())),
        reasoning_content: None,
        tool_calls: Vec::new(),
        tool_call_id: None,
        name: None,
    }
}

pub fn run(args: RunArgs) -> Result<()> {
    let desc = describe(&args.model)?;
    let name = desc.name.clone();
    if detect_gpu().is_none() {
        eprintln!("warning: no GPU found; running on CPU (supported for development, not recommended for serving)");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let node = Node::new(NodeConfig {
            engines_dir: args.engines_dir.clone(),
            models: vec![desc.clone()],
            slots: 1,
            threads: args.threads,
            cache_bytes: Some(0),
            ..NodeConfig::default()
        })?;
        if !node.models().contains(&name) {
            let reason = node.models().engine_for(desc.format, &desc.architecture).err();
            bail!("no engine plugin can run {name}: {}", reason.map_or_else(|| "unknown".into(), |e| e.to_string()));
        }
        let started = Instant::now();
        let model = node.models().get(&name).await?;
        let engine = model.engine_id().to_owned();
        let mut messages: Vec<ChatMessage> = args.system.iter().map(|s| message(Role::System, s)).collect();
        messages.push(message(Role::User, &args.prompt));
        let sampling = Sampling {
            max_tokens: Some(args.max_tokens),
            temperature: args.temperature,
            seed: args.seed,
            ..Sampling::default()
        };
        let request = ChatRequest {
            model: name.clone(),
            messages,
            tools: Vec::new(),
            tool_choice: ToolChoice::None,
            sampling: sampling.clone(),
            stream: true,
            include_usage: false,
            template_kwargs: Default::default(),
            constraint_param: "response_format",
            parallel_tool_calls: true,
            unset: Default::default(),
            n: 1,
            continue_final_message: false,
            add_generation_prompt: true,
            thinking_budget: None,
        };
        let (prompt, _) = render_chat(&model, &request)?;
        let input = GenerationInput { prompt, sampling, endpoint: "run", arrived: Instant::now() };
        let mut generation = node.generate(&model, input).await?;
        let mut out = std::io::stdout().lock();
        let (mut first, mut last) = (None, Instant::now());
        while let Some(event) = generation.events.recv().await {
            match event {
                GenEvent::Piece(piece) => {
                    last = Instant::now();
                    first.get_or_insert(last);
                    out.write_all(piece.text.as_bytes())?;
                    out.flush()?;
                }
                GenEvent::Done(done) => {
                    let f = done?;
                    writeln!(out)?;
                    let first = first.unwrap_or(last);
                    let decode = last.duration_since(first).as_secs_f64().max(1e-9);
                    eprintln!(
                        "[{name} via {engine}: {} prompt tokens, {} generated ({}), {:.0} ms to first token from start, {:.1} tok/s]",
                        f.prompt_tokens,
                        f.completion_tokens,
                        if f.stopped { "stop" } else { "length" },
                        first.duration_since(started).as_secs_f64() * 1e3,
                        f.completion_tokens.saturating_sub(1) as f64 / decode,
                    );
                    return Ok(());
                }
            }
        }
        bail!("the engine stopped without finishing the answer")
    })
}
