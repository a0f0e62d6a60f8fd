//! The published JSON Schema agrees with the manifests we ship and with the validator.

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
use llmr_engine_host::MANIFEST_SCHEMA_PATH;

fn schema() -> jsonschema::Validator {
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(MANIFEST_SCHEMA_PATH).unwrap()).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

fn shipped_manifests() -> Vec<std::path::PathBuf> {
    let mut found = vec![std::path::PathBuf::from(format!("{REPO}/sdk/c/template/manifest.json"))];
    for engine in std::fs::read_dir(format!("{REPO}/engines")).unwrap().flatten() {
        for backend in std::fs::read_dir(engine.path()).into_iter().flatten().flatten() {
            let m = backend.path().join("manifest.json");
            if m.is_file() {
                found.push(m);
            }
        }
    }
    found
}

#[test]
fn every_shipped_manifest_validates_against_the_schema() {
    let v = schema();
    let manifests = shipped_manifests();
    assert!(manifests.len() >= 2);
    for path in manifests {
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let errors: Vec<String> = v.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
    }
}

#[test]
fn the_schema_rejects_what_the_validator_rejects() {
    let v = schema();
    let good: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{REPO}/sdk/c/template/manifest.json")).unwrap())
            .unwrap();
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let bad_edits: Vec<(&str, Edit)> = vec![
        ("empty architectures", Box::new(|m| m["architectures"] = serde_json::json!([]))),
        ("binary with a path", Box::new(|m| m["binary"] = "../x.so".into())),
        ("unknown backend", Box::new(|m| m["gpu_backends"] = serde_json::json!(["tpu"]))),
        ("bad version", Box::new(|m| m["version"] = "1.0".into())),
        ("unknown field", Box::new(|m| m["surprise"] = true.into())),
        (
            "no binary",
            Box::new(|m| {
                m.as_object_mut().unwrap().remove("binary");
            }),
        ),
    ];
    for (what, edit) in bad_edits {
        let mut doc = good.clone();
        edit(&mut doc);
        assert!(!v.is_valid(&doc), "schema accepted a manifest with {what}");
    }
}
