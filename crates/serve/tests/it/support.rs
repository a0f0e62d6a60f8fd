//! An engines folder with the echo plugin, and echo models.

use llmr_model_store::ModelDescriptor;
use llmr_node::NodeConfig;
use llmr_serve::ServeConfig;
use std::path::{Path, PathBuf};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The echo plugin built by `cargo build -p llmr-echo-engine` (or installed in `engines/`).
fn echo_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().unwrap().parent().unwrap();
    let name = format!("{}llmr_echo_engine{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    let installed = Path::new(REPO).join("engines/echo/cpu").join(&name);
    [profile.join(&name), installed].into_iter().find(|p| p.is_file()).expect(
        "the echo plugin is missing: run `cargo build -p llmr-echo-engine` before the tests (scripts/test does)",
    )
}

/// An engines folder under `root` holding the echo plugin, declared as a `LlamaCpp` runtime so
/// that it runs GGUF models of architecture `echo`; `delay_ms` between generated tokens.
pub fn echo_engines(root: &Path, delay_ms: u64) -> PathBuf {
    let dir = root.join("echo").join("cpu");
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(Path::new(REPO).join("engines/echo/cpu/manifest.json")).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    manifest["runtimes"] = serde_json::json!(["LlamaCpp"]);
    manifest["parameters"]["token_delay_ms"] = serde_json::json!(delay_ms);
    manifest.as_object_mut().unwrap().remove("$schema");
    std::fs::write(dir.join("manifest.json"), serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
    let lib = echo_library();
    std::fs::copy(&lib, dir.join(lib.file_name().unwrap())).unwrap();
    root.to_path_buf()
}

/// A GGUF with only `general.architecture = echo`, written to `path`, as the model `name`.
pub fn echo_model(path: &Path, name: &str) -> ModelDescriptor {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend(1u64.to_le_bytes());
    let (key, arch) = ("general.architecture", "echo");
    out.extend((key.len() as u64).to_le_bytes());
    out.extend(key.as_bytes());
    out.extend(8u32.to_le_bytes());
    out.extend((arch.len() as u64).to_le_bytes());
    out.extend(arch.as_bytes());
    out.resize(out.len().div_ceil(32) * 32 + 64, 0x5a);
    std::fs::write(path, out).unwrap();
    let mut desc = ModelDescriptor::from_gguf_file(path).unwrap();
    desc.name = name.to_owned();
    desc
}

/// `llmr serve` on 127.0.0.1 (a free port) serving one echo model `name`, everything under `dir`.
pub fn serve_config(dir: &Path, name: &str, delay_ms: u64) -> ServeConfig {
    let engines = echo_engines(&dir.join("engines"), delay_ms);
    let model = echo_model(&dir.join(format!("{name}.gguf")), name);
    ServeConfig {
        host: "127.0.0.1".into(),
        port: 0,
        api_key: None,
        no_auth: false,
        node: NodeConfig { engines_dir: engines, models: vec![model], cache_bytes: Some(0), ..NodeConfig::default() },
        store: dir.join("models"),
        scan_store: false,
        default_model: name.to_owned(),
        router_db: Some(dir.join("router.db")),
    }
}
