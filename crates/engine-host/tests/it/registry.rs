//! EngineRegistry::resolve: which plugin serves a model.

use crate::support::*;
use llmr_engine_host::{discover, DiscoveryOptions, EngineRegistry, ModelRequirements, ResolveError};
use std::collections::HashMap;

/// Builds C template variants with the given ids (and manifest edits) into one engine root.
fn registry_of(variants: &[(&str, bool)]) -> (tempfile::TempDir, EngineRegistry) {
    let root = tempfile::tempdir().unwrap();
    let mut registry = EngineRegistry::new();
    for (id, builtin) in variants {
        let build = tempfile::tempdir().unwrap();
        let lib = build_c_template(build.path(), &[&format!("-DECHO_ENGINE_ID=\"{id}\"")]);
        let mut m = c_template_manifest();
        m["id"] = (*id).into();
        m["builtin"] = (*builtin).into();
        m["architectures"] = serde_json::json!(["llama", "qwen2"]);
        install(root.path(), id, "cpu", &m, Some(&lib));
        // Register in the order given, one folder at a time.
        let single = tempfile::tempdir().unwrap();
        std::fs::rename(root.path().join(id), single.path().join(id)).unwrap();
        discover(single.path(), &DiscoveryOptions { gpu: None, allow_cpu: true }, &mut registry);
        std::fs::rename(single.path().join(id), root.path().join(id)).ok();
    }
    (root, registry)
}

fn req<'a>(arch: &'a str, scores: Option<&'a HashMap<String, f64>>) -> ModelRequirements<'a> {
    ModelRequirements { runtime: None, format: "gguf", architecture: arch, scores }
}

#[test]
fn unsupported_architecture_names_the_plugin_and_what_it_supports() {
    let (_root, registry) = registry_of(&[("alpha", true)]);
    let err = registry.resolve(&req("gemma3", None)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Model architecture 'gemma3' is not supported by plugin 'alpha'. Supported: [\"llama\", \"qwen2\"]"
    );
    let err = registry.resolve(&ModelRequirements { format: "safetensors", ..req("llama", None) }).unwrap_err();
    assert_eq!(err, ResolveError::NoEngineForFormat { format: "safetensors".into(), runtime: None });
}

#[test]
fn precedence_is_score_then_third_party_then_registration_order() {
    let (_root, registry) = registry_of(&[("alpha", true), ("beta", true), ("gamma", false)]);
    // No scores: the third-party plugin wins.
    assert_eq!(registry.resolve(&req("llama", None)).unwrap().id(), "gamma");
    // A recorded benchmark score wins over everything.
    let scores = HashMap::from([("beta".to_string(), 9.0), ("alpha".to_string(), 3.0)]);
    assert_eq!(registry.resolve(&req("llama", Some(&scores))).unwrap().id(), "beta");
    // Runtime filter applies before anything else.
    let r = ModelRequirements { runtime: Some("LlamaCpp"), ..req("llama", None) };
    assert!(registry.resolve(&r).is_err());

    let (_root, registry) = registry_of(&[("alpha", true), ("beta", true)]);
    assert_eq!(registry.resolve(&req("LLAMA", None)).unwrap().id(), "alpha", "first registered, case-insensitive arch");
    assert_eq!(registry.supported_architectures(), vec!["llama", "qwen2"]);
}
