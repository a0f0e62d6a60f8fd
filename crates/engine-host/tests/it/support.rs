//! Builds plugin folders in temporary engine roots.

use llmr_engine_host::{EngineInstance, Format, ModelSpec};
use std::path::{Path, PathBuf};

pub use llmr_testkit::{build_c_template, c_template_manifest, echo_library};

/// Writes `engines/<id>/<backend>/` under `root` with `manifest` and a copy of `library` named
/// as the manifest's `binary` says (when that name is a plain file name).
pub fn install(root: &Path, id: &str, backend: &str, manifest: &serde_json::Value, library: Option<&Path>) -> PathBuf {
    let dir = root.join(id).join(backend);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("manifest.json"), serde_json::to_vec_pretty(manifest).unwrap()).unwrap();
    if let (Some(lib), Some(name)) = (library, manifest["binary"].as_str()) {
        if !name.contains('/') && !name.contains("..") {
            std::fs::copy(lib, dir.join(name)).unwrap();
        }
    }
    dir
}

/// The echo plugin's committed manifest, with edits applied.
pub fn echo_manifest(edit: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
    let mut m = llmr_testkit::echo_manifest();
    edit(&mut m);
    m
}

pub fn install_echo(root: &Path) -> PathBuf {
    install(root, "echo", "cpu", &echo_manifest(|_| {}), Some(&echo_library()))
}

/// A file that passes for a model with the echo engines.
pub fn dummy_model(dir: &Path) -> PathBuf {
    let p = dir.join("model.gguf");
    std::fs::write(&p, b"not a real model").unwrap();
    p
}

/// Loads `file` into `engine` under the id `m`, as every echo-plugin test does.
pub fn load_as_m(engine: &EngineInstance, file: &Path) {
    engine.load_model(&ModelSpec::new("m", Format::Gguf, file.display().to_string())).unwrap();
}
