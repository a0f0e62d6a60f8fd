//! Fuzzing `manifest.json` parsing and validation (issue 16: untrusted files never crash
//! anything): a plugin folder is third-party content. Seeds: `tests/fuzz-seeds/manifest/` (the
//! committed plugins' manifests and a minimal one using the spec's singular and numeric forms),
//! mutated as JSON documents (values of the wrong type, odd and path-like strings, deep nesting,
//! numbers out of range, repeated keys) and as bytes. Each input is written as
//! `engines/<id>/<backend>/manifest.json`, named after the document's own id and first backend
//! when they are plain names (so that validation gets past the folder checks), with the binary
//! it names present when that is a plain file name.
//! Property: `Manifest::load` returns Ok or a `ManifestError` without panicking or hanging, and a
//! manifest it accepts has the folder's id, the host's ABI, a backend, an architecture and a
//! binary inside the folder.
//!
//! `LLMR_FUZZ_CASES=N` or `LLMR_FUZZ_SECS=S` for longer runs (`scripts/fuzz`).

#[path = "../../../tests/fuzz/harness.rs"]
mod harness;

use harness::{fuzz, json_inputs, load_seeds, note, variant, watch};
use llmr_engine_abi::LLMR_ENGINE_ABI_MAJOR;
use llmr_engine_host::{Manifest, ManifestError};
use proptest::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn seeds() -> Arc<Vec<Vec<u8>>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-seeds/manifest");
    Arc::new(load_seeds(&dir).into_iter().map(|(_, bytes)| bytes).collect())
}

fn plain_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn plain_file(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
        && s != "manifest.json"
}

/// The folder and binary an input asks for, where they are plain names.
fn layout(bytes: &[u8]) -> (String, String, Option<String>) {
    let doc: Option<Value> = serde_json::from_slice(bytes).ok();
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let id = text(doc.as_ref().and_then(|d| d.get("id"))).filter(|s| plain_id(s)).unwrap_or_else(|| "echo".into());
    let backend = text(doc.as_ref().and_then(|d| d.get("gpu_backends")).and_then(|b| b.get(0)))
        .or_else(|| text(doc.as_ref().and_then(|d| d.get("gpu_backend"))))
        .filter(|s| plain_id(s))
        .unwrap_or_else(|| "cpu".into());
    let binary = text(doc.as_ref().and_then(|d| d.get("binary"))).filter(|s| plain_file(s));
    (id, backend, binary)
}

/// What a manifest `Manifest::load` accepted from `dir` (`engines/<id>/<backend>/`) must say.
fn accepted(m: &Manifest, dir: &Path, id: &str, backend: &str, abi: u32) -> Result<(), TestCaseError> {
    prop_assert_eq!(&m.id, id);
    prop_assert_eq!(m.abi_version, abi);
    prop_assert!(m.gpu_backends.iter().any(|b| b.as_str() == backend));
    prop_assert!(m.architectures.iter().any(|a| !a.trim().is_empty()));
    prop_assert!(dir.join(&m.binary).is_file(), "binary {:?}", m.binary);
    prop_assert!(Path::new(&m.binary).components().count() == 1, "binary {:?}", m.binary);
    Ok(())
}

fn check(root: &Path, bytes: &[u8], abi: u32) -> Result<(), TestCaseError> {
    let (id, backend, binary) = layout(bytes);
    let plugin: PathBuf = root.join("engines").join(&id);
    let dir = plugin.join(&backend);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("manifest.json"), bytes).unwrap();
    if let Some(binary) = &binary {
        std::fs::write(dir.join(binary), b"not really a library").unwrap();
    }
    let loaded = watch(bytes, || Manifest::load(&dir, abi));
    let outcome = match &loaded {
        Ok(m) => {
            note("ok");
            accepted(m, &dir, &id, &backend, abi)
        }
        Err(e) => {
            let _ = e.to_string();
            note(&match e {
                ManifestError::Invalid { reason, .. } | ManifestError::Unreadable { reason, .. } => {
                    format!("{}: {}", variant(e), reason.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                }
                other => variant(other),
            });
            Ok(())
        }
    };
    std::fs::remove_dir_all(&plugin).unwrap();
    outcome
}

fn abi() -> impl Strategy<Value = u32> {
    prop_oneof![9 => Just(LLMR_ENGINE_ABI_MAJOR), 1 => any::<u32>()]
}

#[test]
fn seeds_are_valid() {
    let root = tempfile::tempdir().unwrap();
    for bytes in seeds().iter() {
        let (id, backend, binary) = layout(bytes);
        check(root.path(), bytes, LLMR_ENGINE_ABI_MAJOR).unwrap();
        let dir = root.path().join("engines").join(&id).join(&backend);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("manifest.json"), bytes).unwrap();
        std::fs::write(dir.join(binary.unwrap()), b"").unwrap();
        Manifest::load(&dir, LLMR_ENGINE_ABI_MAJOR).unwrap_or_else(|e| panic!("seed {id}/{backend}: {e}"));
    }
}

#[test]
fn fuzz_manifest_json() {
    let root = tempfile::tempdir().unwrap();
    fuzz("manifest", 4000, (json_inputs(seeds()), abi()), |(bytes, abi)| check(root.path(), &bytes, abi));
}
