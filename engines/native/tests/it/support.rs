//! The plugin, loaded once per test binary, and engines over it.

use llmr_engine_host::{load_one, EngineInstance, EngineRegistry, Format, InstanceConfig, Manifest, ModelSpec, Plugin};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// A model folder (or file) of `scripts/fetch-models`' cache.
pub fn cached_model(name: &str) -> PathBuf {
    let cache = std::env::var("LLMR_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/llmr/models"));
    let p = cache.join(name);
    assert!(p.exists(), "{} is missing: run scripts/fetch-models first", p.display());
    p
}

/// A plugin folder holding the committed manifest of engine `id` and the release library
/// `lib` that cargo built beside this test binary.
fn load_plugin(id: &str, lib: &str, package: &str) -> Arc<Plugin> {
    load_plugin_for(id, "cpu", lib, package)
}

/// As `load_plugin`, with the manifest of `backend`'s folder (the GPU ones pass their backend
/// to the engine).
fn load_plugin_for(id: &str, backend: &str, lib: &str, package: &str) -> Arc<Plugin> {
    let exe = std::env::current_exe().unwrap();
    let built = exe.parent().unwrap().parent().unwrap().join(lib);
    assert!(built.is_file(), "{} is missing: run `cargo build --release -p {package}`", built.display());
    let dir = std::env::temp_dir().join(format!("llmr-native-test-{}", std::process::id())).join(id).join(backend);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(format!("{REPO}/engines/{id}/{backend}/manifest.json"), dir.join("manifest.json")).unwrap();
    std::fs::copy(&built, dir.join(lib)).unwrap();
    let mut registry = EngineRegistry::new();
    load_one(&dir, Manifest::load(&dir, 1).unwrap(), &mut registry).unwrap()
}

/// This crate's plugin.
pub fn plugin() -> Arc<Plugin> {
    static PLUGIN: OnceLock<Arc<Plugin>> = OnceLock::new();
    PLUGIN.get_or_init(|| load_plugin("native", "libllmr_native_engine.so", "llmr-native-engine")).clone()
}

/// This crate's plugin from its `cuda` folder, loaded once per test binary as `plugin` is (the
/// GPU suite crashed when a test loaded it again after an earlier test had unloaded it).
#[cfg(feature = "cuda")]
pub fn cuda_plugin() -> Arc<Plugin> {
    static PLUGIN: OnceLock<Arc<Plugin>> = OnceLock::new();
    PLUGIN.get_or_init(|| load_plugin_for("native", "cuda", "libllmr_native_engine.so", "llmr-native-engine")).clone()
}

/// The llama.cpp plugin, the reference the native engine is compared with.
pub fn llama_plugin() -> Arc<Plugin> {
    static PLUGIN: OnceLock<Arc<Plugin>> = OnceLock::new();
    PLUGIN.get_or_init(|| load_plugin("llama_cpp", "libllmr_llama_cpp.so", "llmr-llama-cpp")).clone()
}

pub fn engine(slots: u32) -> EngineInstance {
    instance(&plugin(), slots)
}

pub fn instance(plugin: &Arc<Plugin>, slots: u32) -> EngineInstance {
    EngineInstance::create(plugin, &InstanceConfig { slots, context_length: 2048, ..Default::default() }).unwrap()
}

/// The primary file of a safetensors model folder (the index when the checkpoint is sharded).
pub fn primary(dir: &Path) -> PathBuf {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        index
    } else {
        dir.join("model.safetensors")
    }
}

pub fn spec(id: &str, dir: &Path) -> ModelSpec {
    ModelSpec::new(id, Format::Safetensors, primary(dir).display().to_string())
}
