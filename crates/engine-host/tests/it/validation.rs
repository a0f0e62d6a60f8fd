//! Every manifest validation rule, with the message the spec gives it.

use crate::support::*;
use llmr_engine_host::{discover, DiscoveryOptions, EngineRegistry, GpuBackend, Manifest, ManifestError, PluginState};

const CPU_ONLY: DiscoveryOptions = DiscoveryOptions { gpu: None, allow_cpu: true };

fn load_echo_with(edit: impl FnOnce(&mut serde_json::Value)) -> Result<Manifest, ManifestError> {
    let root = tempfile::tempdir().unwrap();
    let dir = install(root.path(), "echo", "cpu", &echo_manifest(edit), Some(&echo_library()));
    Manifest::load(&dir, 1)
}

fn refusal(result: Result<Manifest, ManifestError>) -> String {
    result.expect_err("the manifest should be refused").to_string()
}

#[test]
fn the_committed_manifest_is_valid() {
    let m = load_echo_with(|_| {}).unwrap();
    assert_eq!(m.id, "echo");
    assert_eq!(m.gpu_backends, vec![GpuBackend::Cpu]);
    assert_eq!(m.parameters["token_delay_ms"], 0);
}

#[test]
fn abi_version_mismatch_in_the_manifest() {
    assert_eq!(refusal(load_echo_with(|m| m["abi_version"] = "2".into())), "ABI version mismatch: expected 1, got 2");
    assert_eq!(refusal(load_echo_with(|m| m["abi_version"] = 7.into())), "ABI version mismatch: expected 1, got 7");
    assert_eq!(refusal(load_echo_with(|m| m["abi_version"] = "v1".into())), "ABI version mismatch: expected 1, got v1");
}

#[test]
fn missing_binary() {
    let root = tempfile::tempdir().unwrap();
    let dir = install(root.path(), "echo", "cpu", &echo_manifest(|_| {}), None);
    let msg = refusal(Manifest::load(&dir, 1));
    assert_eq!(msg, format!("Binary not found: {}", dir.join("libllmr_echo_engine.so").display()));
}

#[test]
fn no_architectures() {
    assert_eq!(refusal(load_echo_with(|m| m["architectures"] = serde_json::json!([]))), "No architectures specified");
    assert_eq!(
        refusal(load_echo_with(|m| m.as_object_mut().unwrap().remove("architectures").map(|_| ()).unwrap())),
        "No architectures specified"
    );
}

#[test]
fn gpu_backend_mismatch() {
    let msg = refusal(load_echo_with(|m| m["gpu_backends"] = serde_json::json!(["cuda"])));
    assert!(msg.starts_with("GPU backend mismatch"), "{msg}");
    // The spec's singular form is accepted.
    let m = load_echo_with(|m| {
        m.as_object_mut().unwrap().remove("gpu_backends");
        m["gpu_backend"] = "cpu".into();
    })
    .unwrap();
    assert_eq!(m.gpu_backends, vec![GpuBackend::Cpu]);
}

#[test]
fn binary_paths_that_escape_the_folder_are_refused() {
    for bad in ["../libllmr_echo_engine.so", "/usr/lib/libc.so.6", "sub/lib.so", "..", "a\\b.so"] {
        let msg = refusal(load_echo_with(|m| m["binary"] = bad.into()));
        assert!(msg.starts_with("Binary path escapes the plugin folder"), "{bad}: {msg}");
    }
}

#[test]
fn a_symlink_leading_outside_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let real = outside.path().join("libreal.so");
    std::fs::copy(echo_library(), &real).unwrap();
    let dir = install(root.path(), "echo", "cpu", &echo_manifest(|m| m["binary"] = "liblink.so".into()), None);
    std::os::unix::fs::symlink(&real, dir.join("liblink.so")).unwrap();
    let msg = refusal(Manifest::load(&dir, 1));
    assert!(msg.starts_with("Binary path escapes the plugin folder: liblink.so ->"), "{msg}");
}

#[test]
fn malformed_fields_name_the_field() {
    let msg = refusal(load_echo_with(|m| m["version"] = "1.0".into()));
    assert!(msg.contains("`version` \"1.0\" is not semver"), "{msg}");
    let msg = refusal(load_echo_with(|m| m["formats"] = serde_json::json!(["pickle"])));
    assert!(msg.contains("unknown format \"pickle\""), "{msg}");
    let msg = refusal(load_echo_with(|m| m["modalities"] = serde_json::json!(["telepathy"])));
    assert!(msg.contains("unknown modality \"telepathy\""), "{msg}");
    let msg = refusal(load_echo_with(|m| m["surprise"] = true.into()));
    assert!(msg.contains("unknown field `surprise`"), "{msg}");
    let msg = refusal(load_echo_with(|m| m["id"] = "Echo!".into()));
    assert!(msg.contains("`id` must be"), "{msg}");
}

#[test]
fn manifest_id_must_match_its_folder() {
    let root = tempfile::tempdir().unwrap();
    let dir = install(root.path(), "other", "cpu", &echo_manifest(|_| {}), Some(&echo_library()));
    let msg = refusal(Manifest::load(&dir, 1));
    assert!(msg.starts_with("Plugin ID mismatch"), "{msg}");
}

#[test]
fn a_refused_plugin_is_listed_and_does_not_stop_the_others() {
    let root = tempfile::tempdir().unwrap();
    install_echo(root.path());
    install(root.path(), "broken", "cpu", &serde_json::json!({"id": "broken"}), None);
    let mut registry = EngineRegistry::new();
    let found = discover(root.path(), &CPU_ONLY, &mut registry);
    assert_eq!(found.len(), 2);
    let broken = found.iter().find(|f| f.folder_id() == "broken").unwrap();
    match &broken.state {
        PluginState::Refused(reason) => assert!(reason.contains("Invalid manifest"), "{reason}"),
        other => panic!("expected refusal, got {other:?}"),
    }
    assert!(matches!(found.iter().find(|f| f.folder_id() == "echo").unwrap().state, PluginState::Loaded(_)));
    assert_eq!(registry.plugins().len(), 1);
}

#[test]
fn cpu_plugins_load_only_where_allowed_and_gpu_folders_win() {
    let root = tempfile::tempdir().unwrap();
    install_echo(root.path());
    // A cuda build of the same engine: this node picks it when it has CUDA, and never both.
    install(
        root.path(),
        "echo",
        "cuda",
        &echo_manifest(|m| m["gpu_backends"] = serde_json::json!(["cuda"])),
        Some(&echo_library()),
    );

    let mut registry = EngineRegistry::new();
    let found = discover(root.path(), &DiscoveryOptions { gpu: None, allow_cpu: false }, &mut registry);
    assert!(found.iter().all(|f| matches!(f.state, PluginState::Skipped(_))), "{found:?}");
    assert!(registry.plugins().is_empty());

    let mut registry = EngineRegistry::new();
    let found =
        discover(root.path(), &DiscoveryOptions { gpu: Some(GpuBackend::Cuda), allow_cpu: true }, &mut registry);
    let loaded: Vec<String> =
        found.iter().filter(|f| matches!(f.state, PluginState::Loaded(_))).map(|f| f.folder_backend()).collect();
    assert_eq!(loaded, vec!["cuda"]);
}

#[test]
fn a_gpu_folder_whose_library_was_not_built_leaves_the_cpu_one_in_place() {
    let root = tempfile::tempdir().unwrap();
    install_echo(root.path());
    // The repository ships engines/native/cuda/manifest.json; a machine that built only the CPU
    // library has no library beside it.
    install(root.path(), "echo", "cuda", &echo_manifest(|m| m["gpu_backends"] = serde_json::json!(["cuda"])), None);
    let mut registry = EngineRegistry::new();
    let found =
        discover(root.path(), &DiscoveryOptions { gpu: Some(GpuBackend::Cuda), allow_cpu: true }, &mut registry);
    let state = |backend: &str| &found.iter().find(|f| f.folder_backend() == backend).unwrap().state;
    assert!(matches!(state("cpu"), PluginState::Loaded(_)), "{found:?}");
    match state("cuda") {
        PluginState::Skipped(why) => assert!(why.contains("not built here"), "{why}"),
        other => panic!("expected the unbuilt cuda folder to be skipped, got {other:?}"),
    }
    // Without a CPU fallback the missing library is the reason nothing loads: a refusal.
    let mut registry = EngineRegistry::new();
    let found =
        discover(root.path(), &DiscoveryOptions { gpu: Some(GpuBackend::Cuda), allow_cpu: false }, &mut registry);
    let cuda = found.iter().find(|f| f.folder_backend() == "cuda").unwrap();
    assert!(matches!(&cuda.state, PluginState::Refused(why) if why.contains("not found")), "{found:?}");
}
