//! Fixtures that several crates' tests share: the echo plugin (built by
//! `cargo build -p llmr-echo-engine`, which `scripts/test` does first) installed in a temporary
//! engines folder, and the smallest GGUF file the model store accepts.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The repository root (for committed files such as plugin manifests).
pub fn repo_root() -> &'static Path {
    Path::new(REPO)
}

/// The echo plugin's shared library: the one cargo built next to the running test binary, or the
/// one installed in `engines/echo/cpu/`.
pub fn echo_library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // Test binaries live in `<target>/<profile>/deps/`; the plugin in `<target>/<profile>/`.
    let profile = exe.parent().and_then(Path::parent).expect("a target profile folder");
    let name = format!("{}llmr_echo_engine{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    let installed = repo_root().join("engines/echo/cpu").join(&name);
    [profile.join(&name), installed].into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("the echo plugin is missing: run `cargo build -p llmr-echo-engine` before the tests (scripts/test does)")
    })
}

/// The `llmr-engine-worker` binary that cargo built next to the running test binary (built by
/// `cargo build -p llmr-engine-worker`, which `scripts/test` does first).
pub fn engine_worker_program() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe.parent().and_then(Path::parent).expect("a target profile folder");
    let program = profile.join(format!("llmr-engine-worker{}", std::env::consts::EXE_SUFFIX));
    assert!(
        program.is_file(),
        "the engine worker is missing: run `cargo build -p llmr-engine-worker` before the tests (scripts/test does)"
    );
    program
}

/// The echo plugin's committed manifest.
pub fn echo_manifest() -> serde_json::Value {
    let path = repo_root().join("engines/echo/cpu/manifest.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// An engines folder at `root` holding the echo plugin, declared as a `LlamaCpp` runtime so that
/// it runs GGUF models of architecture `echo` (see [`gguf_with_architecture`]), with `delay_ms`
/// between generated tokens (the manifest's `token_delay_ms`). Returns `root`.
pub fn echo_engines(root: &Path, delay_ms: u64) -> PathBuf {
    echo_engines_with(root, serde_json::json!({ "token_delay_ms": delay_ms }))
}

/// [`echo_engines`] whose engine crashes, aborts or hangs on a magic prompt
/// (`LLMR_CRASH_SEGFAULT`, `LLMR_CRASH_ABORT`, `LLMR_HANG`): only for models run in an engine
/// worker process, see [`engine_worker_program`].
pub fn crashing_echo_engines(root: &Path, delay_ms: u64) -> PathBuf {
    echo_engines_with(root, serde_json::json!({ "token_delay_ms": delay_ms, "crash_on_demand": true }))
}

fn echo_engines_with(root: &Path, parameters: serde_json::Value) -> PathBuf {
    let dir = root.join("echo").join("cpu");
    std::fs::create_dir_all(&dir).unwrap();
    let mut manifest = echo_manifest();
    manifest["runtimes"] = serde_json::json!(["LlamaCpp"]);
    manifest["parameters"] = parameters;
    manifest.as_object_mut().expect("a manifest object").remove("$schema");
    std::fs::write(dir.join("manifest.json"), serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
    let lib = echo_library();
    std::fs::copy(&lib, dir.join(lib.file_name().unwrap())).unwrap();
    root.to_path_buf()
}

/// A GGUF (version 3) with one metadata key, `general.architecture = arch`, no tensors, and
/// `filler` bytes after the aligned header.
pub fn gguf_with_architecture(arch: &str, filler: usize) -> Vec<u8> {
    const GGUF_TYPE_STRING: u32 = 8;
    let key = "general.architecture";
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes()); // version
    out.extend(0u64.to_le_bytes()); // tensors
    out.extend(1u64.to_le_bytes()); // metadata keys
    out.extend((key.len() as u64).to_le_bytes());
    out.extend(key.as_bytes());
    out.extend(GGUF_TYPE_STRING.to_le_bytes());
    out.extend((arch.len() as u64).to_le_bytes());
    out.extend(arch.as_bytes());
    out.resize(out.len().div_ceil(32) * 32 + filler, 0x5a);
    out
}

/// Compiles the C template plugin (`sdk/c/template/echo_engine.c`) into `out_dir` with the
/// system C compiler and extra flags (`-DECHO_VERSION="0.2.0"`, `-DECHO_ABI_MAJOR=2`, ...).
pub fn build_c_template(out_dir: &Path, extra_flags: &[&str]) -> PathBuf {
    let lib = out_dir.join("libllmr_c_echo.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-fvisibility=hidden"])
        .args(extra_flags)
        .arg("-I")
        .arg(repo_root().join("sdk/c/include"))
        .arg(repo_root().join("sdk/c/template/echo_engine.c"))
        .arg("-o")
        .arg(&lib)
        .arg("-lpthread")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(out.status.success(), "C template failed to build:\n{}", String::from_utf8_lossy(&out.stderr));
    lib
}

/// The C template's committed manifest.
pub fn c_template_manifest() -> serde_json::Value {
    let path = repo_root().join("sdk/c/template/manifest.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}
