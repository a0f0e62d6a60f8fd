//! Finds plugins under `engines/<engine_id>/<gpu_backend>/manifest.json` and loads the folder
//! that matches this node's GPU (`cpu` only where the node allows CPU). A refused plugin never
//! stops the node: it is reported with its reason and logged as an error.

use crate::manifest::{GpuBackend, Manifest, ManifestError};
use crate::plugin::Plugin;
use crate::registry::EngineRegistry;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Clone, Copy, Debug)]
pub struct DiscoveryOptions {
    /// The node's GPU backend; `None` when it has no GPU.
    pub gpu: Option<GpuBackend>,
    /// Load `cpu` folders (the specs' not-recommended fallback).
    pub allow_cpu: bool,
}

#[derive(Debug)]
pub enum PluginState {
    Loaded(Arc<Plugin>),
    /// Invalid or rejected; the message says why.
    Refused(String),
    /// Valid or not, not for this node (another backend, or CPU not allowed).
    Skipped(String),
}

/// One plugin folder found on disk.
#[derive(Debug)]
pub struct FoundPlugin {
    pub dir: PathBuf,
    pub manifest: Option<Manifest>,
    pub state: PluginState,
}

impl FoundPlugin {
    /// The engine id as the folder names it.
    pub fn folder_id(&self) -> String {
        self.dir.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }
    pub fn folder_backend(&self) -> String {
        self.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

fn sorted_subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    dirs.sort();
    dirs
}

/// Which backend folder of one engine this node loads, in order of preference.
fn wanted_backend(options: &DiscoveryOptions, available: &[String]) -> Option<String> {
    let has = |b: GpuBackend| available.iter().any(|a| a == b.as_str());
    match options.gpu {
        Some(gpu) if has(gpu) => Some(gpu.as_str().into()),
        _ if options.allow_cpu && has(GpuBackend::Cpu) => Some("cpu".into()),
        _ => None,
    }
}

/// Whether a plugin folder may be opened in this process: `Err` says why not (a node running
/// engines in workers first opens each plugin in a process of its own, `probe`).
pub type Vet<'a> = &'a dyn Fn(&Path) -> Result<(), String>;

/// Scans `root`, registers every plugin it loads into `registry`, and reports every folder.
pub fn discover(root: &Path, options: &DiscoveryOptions, registry: &mut EngineRegistry) -> Vec<FoundPlugin> {
    discover_vetted(root, options, registry, &|_| Ok(()))
}

/// [`discover`], opening only the plugin folders `vet` accepts (the others are refused with
/// its reason).
pub fn discover_vetted(
    root: &Path,
    options: &DiscoveryOptions,
    registry: &mut EngineRegistry,
    vet: Vet<'_>,
) -> Vec<FoundPlugin> {
    sorted_subdirs(root).iter().flat_map(|engine_dir| discover_engine(engine_dir, options, registry, vet)).collect()
}

/// One engine's folder (`engines/<engine_id>/`): registers the backend folder this node loads
/// (if `vet` accepts it), and reports every backend folder in it.
pub fn discover_engine(
    engine_dir: &Path,
    options: &DiscoveryOptions,
    registry: &mut EngineRegistry,
    vet: Vet<'_>,
) -> Vec<FoundPlugin> {
    let mut found = Vec::new();
    let backends: Vec<(PathBuf, String, Result<Manifest, ManifestError>)> = sorted_subdirs(engine_dir)
        .into_iter()
        .filter(|d| d.join("manifest.json").is_file())
        .map(|d| {
            let name = d.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let manifest = Manifest::load(&d, llmr_engine_abi::LLMR_ENGINE_ABI_MAJOR);
            (d, name, manifest)
        })
        .collect();
    // A folder whose library was never built (a GPU variant on a machine that built only
    // the CPU one) does not take the place of one that was.
    let built = |m: &Result<Manifest, ManifestError>| !matches!(m, Err(ManifestError::BinaryNotFound(_)));
    let names: Vec<String> = backends.iter().filter(|(_, _, m)| built(m)).map(|(_, n, _)| n.clone()).collect();
    let wanted = wanted_backend(options, &names);
    for (dir, name, manifest) in backends {
        let state = match (&manifest, wanted.as_deref() == Some(name.as_str())) {
            (Err(ManifestError::BinaryNotFound(p)), _) if wanted.is_some() => {
                PluginState::Skipped(format!("not built here ({} is missing)", p.display()))
            }
            (Err(e), _) => PluginState::Refused(e.to_string()),
            (Ok(_), false) => PluginState::Skipped(skip_reason(options, &name)),
            (Ok(m), true) => match vet(&dir)
                .map_err(|reason| reason.to_string())
                .and_then(|()| load_one(&dir, m.clone(), registry).map_err(|e| e.to_string()))
            {
                Ok(p) => PluginState::Loaded(p),
                Err(reason) => PluginState::Refused(reason),
            },
        };
        if let PluginState::Refused(reason) = &state {
            tracing::error!(plugin = %dir.display(), "engine plugin refused: {reason}");
        }
        found.push(FoundPlugin { dir, manifest: manifest.ok(), state });
    }
    found
}

fn skip_reason(options: &DiscoveryOptions, folder: &str) -> String {
    match (options.gpu, folder) {
        (_, "cpu") if !options.allow_cpu => "CPU plugins are not allowed on this node".into(),
        (Some(gpu), _) => format!("built for {folder}, this node uses {gpu}"),
        (None, _) => format!("built for {folder}, this node has no GPU"),
    }
}

/// Opens one plugin folder and registers it (refusing a second plugin with the same id).
pub fn load_one(dir: &Path, manifest: Manifest, registry: &mut EngineRegistry) -> Result<Arc<Plugin>, ManifestError> {
    registry.check_id_free(&manifest)?;
    let plugin = Plugin::open(dir, manifest)?;
    registry.register(plugin.clone())?;
    tracing::info!(engine = plugin.id(), version = %plugin.manifest.version, dir = %dir.display(), "engine plugin loaded");
    Ok(plugin)
}
