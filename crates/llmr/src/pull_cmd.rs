//! `llmr pull NAME`: downloads a GGUF model from a Hugging Face compatible hub into the local
//! store (`llmr_hub::pull`), with a progress bar; `llmr pull --file PATH` imports a local GGUF
//! instead. Either way it ends by printing the name the model is served as.
//!
//! The hub client is async (the router and the node share it); this command is its one blocking
//! caller and runs it on a current-thread runtime of its own, for the one pull it makes.

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use llmr_hub::pull::PullSpec;
use llmr_hub::Hub;
use llmr_model_store::{ModelDescriptor, ModelName, ModelStore};
use std::path::{Path, PathBuf};

/// Where the local model store is; shared by `llmr pull` and `llmr list`.
#[derive(Args, Clone, Debug)]
pub struct StoreArgs {
    /// The model store [default: ~/.llmr/models].
    #[arg(long = "store", env = "LLMR_MODELS", value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

impl StoreArgs {
    pub fn open(&self) -> Result<ModelStore> {
        let root = match &self.dir {
            Some(dir) => dir.clone(),
            None => ModelStore::default_root().context("no home directory for the model store; pass --store DIR")?,
        };
        ModelStore::open(&root).with_context(|| format!("opening the model store {}", root.display()))
    }
}

#[derive(Args)]
pub struct PullArgs {
    /// `owner/repo`, `owner/repo:QUANT` (e.g. `:Q4_K_M`, matched exactly) or
    /// `owner/repo/path/file.gguf`, on $HF_ENDPOINT (default https://huggingface.co); gated or
    /// private models need $HF_TOKEN.
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    model: Option<String>,
    /// Import this local GGUF file instead of downloading one.
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// The name in the store [default: owner/repo, or the file's stem with --file]. With --file
    /// it may carry the quantization, `name:QUANT`, checked against the file.
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
}

pub fn run(args: PullArgs) -> Result<()> {
    let store = args.store.open()?;
    let descriptor = match (&args.file, &args.model) {
        (Some(file), _) => import(&store, file, args.name.as_deref())?,
        (None, Some(model)) => download(&store, model, args.name.as_deref())?,
        (None, None) => unreachable!("clap requires a model or --file"),
    };
    println!("serve it as: {}", descriptor.name);
    Ok(())
}

fn import(store: &ModelStore, file: &Path, name: Option<&str>) -> Result<ModelDescriptor> {
    let name = match name {
        Some(name) => name.to_string(),
        None => file
            .file_stem()
            .and_then(|s| s.to_str())
            .with_context(|| format!("{}: no file name to name the model after; pass --name", file.display()))?
            .to_string(),
    };
    let descriptor = store
        .import_file(&name, file)
        .with_context(|| format!("importing {} as '{name}' (pass --name to choose another name)", file.display()))?;
    eprintln!("imported {} ({})", file.display(), summary(&descriptor));
    Ok(descriptor)
}

fn download(store: &ModelStore, model: &str, name: Option<&str>) -> Result<ModelDescriptor> {
    let spec = PullSpec::parse(model)?;
    let name = match name {
        Some(name) => ModelName::parse(name)?,
        None => spec.repo.clone(),
    };
    let hub = Hub::from_env()?;
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    let remote = runtime.block_on(hub.locate(&spec))?;
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}")?
            .progress_chars("=> "),
    );
    bar.set_message(remote.file_name().to_string());
    let pulled = runtime.block_on(hub.pull(store, &remote, &name, |done, total| {
        if let Some(total) = total {
            bar.set_length(total);
        }
        bar.set_position(done);
    }));
    bar.finish_and_clear();
    let pulled = pulled.map_err(|error| {
        let resumable = error.is_resumable();
        let error = anyhow::Error::new(error);
        if resumable {
            error.context(format!("pulling {model} failed; run the same command again to resume"))
        } else {
            error.context(format!("pulling {model}"))
        }
    })?;
    let d = &pulled.descriptor;
    if pulled.already_present {
        eprintln!("{} from {} is already in the store ({})", remote.path, remote.repo, summary(d));
    } else {
        eprintln!("pulled {} from {} at {} ({})", remote.path, remote.repo, hub.endpoint(), summary(d));
        if !pulled.extras.is_empty() {
            eprintln!("also fetched {}", pulled.extras.join(", "));
        }
    }
    Ok(pulled.descriptor)
}

fn summary(d: &ModelDescriptor) -> String {
    let quant = d.quantization.as_deref().map(|q| format!(" {q}")).unwrap_or_default();
    format!("{}{quant}, {}, in {}", d.architecture, HumanBytes(d.size_bytes), d.model_dir.display())
}
