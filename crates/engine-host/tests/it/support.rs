//! Builds plugin folders in temporary engine roots.

use llmr_engine_host::{EngineInstance, Format, ModelSpec};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

pub use llmr_testkit::echo_library;

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

/// Compiles the C template plugin into `out_dir`, with extra compiler flags.
pub fn build_c_template(out_dir: &Path, extra_flags: &[&str]) -> PathBuf {
    let lib = out_dir.join("libllmr_c_echo.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-fvisibility=hidden"])
        .args(extra_flags)
        .arg("-I")
        .arg(format!("{REPO}/sdk/c/include"))
        .arg(format!("{REPO}/sdk/c/template/echo_engine.c"))
        .arg("-o")
        .arg(&lib)
        .arg("-lpthread")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(out.status.success(), "C template failed to build:\n{}", String::from_utf8_lossy(&out.stderr));
    lib
}

pub fn c_template_manifest() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{REPO}/sdk/c/template/manifest.json")).unwrap()).unwrap()
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
