//! Name resolution, quantization tags, projectors, listing, and path safety.

use crate::support::{link, minilm, small_model, smollm2, tiny_llama};
use llmr_model_store::gguf::GgufErrorKind;
use llmr_model_store::{Capability, ModelDescriptor, ModelStore, NameProblem, StoreError};
use std::path::Path;

fn new_store() -> (tempfile::TempDir, ModelStore) {
    let tmp = tempfile::tempdir().unwrap();
    let store = ModelStore::open(tmp.path().join("models")).unwrap();
    (tmp, store)
}

fn listed(store: &ModelStore) -> Vec<String> {
    let mut names: Vec<String> = store.list().into_iter().map(|d| d.name).collect();
    names.sort();
    names
}

#[test]
fn a_single_gguf_resolves_by_name_and_by_its_exact_tag() {
    let (_tmp, store) = new_store();
    let dir = store.root().join("smollm2");
    let file = link(&smollm2(), &dir, "smollm2-135m-instruct-q4_1.gguf");
    let d = store.resolve("smollm2").unwrap();
    assert_eq!(
        (d.name.as_str(), d.primary_file.as_path(), d.model_dir.as_path()),
        ("smollm2", file.as_path(), dir.as_path())
    );
    assert_eq!(
        (d.architecture.as_str(), d.quantization.as_deref(), d.context_length),
        ("llama", Some("Q4_1"), Some(8192))
    );
    assert_eq!((d.runtime.as_str(), d.capabilities.as_slice()), ("LlamaCpp", &[Capability::Text][..]));
    assert_eq!(store.resolve("smollm2:Q4_1").unwrap().name, "smollm2:Q4_1");

    for near_miss in ["smollm2:q4_1", "smollm2:Q4-1", "smollm2:Q4_K_M"] {
        match store.resolve(near_miss).unwrap_err() {
            StoreError::QuantizationNotFound { available, .. } => assert_eq!(available, ["Q4_1"]),
            other => panic!("{near_miss}: {other}"),
        }
    }
}

#[test]
fn several_quantizations_need_a_tag() {
    let (_tmp, store) = new_store();
    let dir = store.root().join("org").join("llama");
    link(&smollm2(), &dir, "llama-Q4_1.gguf");
    link(&tiny_llama(), &dir, "llama-F16.gguf");
    let err = store.resolve("org/llama").unwrap_err();
    assert_eq!(
        err.to_string(),
        "model 'org/llama' has several GGUF files; ask for one as 'org/llama:<quantization>', available: F16, Q4_1"
    );
    let d = store.resolve("org/llama:F16").unwrap();
    assert_eq!((d.primary_file.file_name().unwrap(), d.context_length), ("llama-F16.gguf".as_ref(), Some(2048)));
    assert_eq!(listed(&store), ["org/llama:F16", "org/llama:Q4_1"]);
}

#[test]
fn a_projector_adds_vision_and_is_never_the_model() {
    let (_tmp, store) = new_store();
    let dir = store.root().join("vlm");
    // Any GGUF serves as the projector file here: only its name makes it one.
    let mmproj = link(&tiny_llama(), &dir, "mmproj-vlm-f16.gguf");
    link(&smollm2(), &dir, "vlm-Q4_1.gguf");
    let d = store.resolve("vlm").unwrap();
    assert_eq!(d.primary_file, dir.join("vlm-Q4_1.gguf"));
    assert_eq!(d.mmproj.as_deref(), Some(mmproj.as_path()));
    assert_eq!(d.capabilities, [Capability::Text, Capability::Vision]);
    assert_eq!(d.size_bytes, 98_362_432 + std::fs::metadata(tiny_llama()).unwrap().len());

    let (_tmp, store) = new_store();
    link(&tiny_llama(), &store.root().join("only"), "only-mmproj.gguf");
    assert!(matches!(store.resolve("only").unwrap_err(), StoreError::NoModelFiles { .. }));
}

#[test]
fn an_encoder_with_pooling_is_an_embedding_model() {
    let (_tmp, store) = new_store();
    link(&minilm(), &store.root().join("minilm"), "all-minilm-l6-v2-f16.gguf");
    let d = store.resolve("minilm").unwrap();
    assert_eq!((d.architecture.as_str(), d.capabilities.as_slice()), ("bert", &[Capability::Embedding][..]));
}

#[test]
fn list_reports_valid_models_and_skips_broken_ones() {
    let (_tmp, store) = new_store();
    let root = store.root();
    link(&smollm2(), &root.join("smollm2"), "smollm2.gguf");
    link(&minilm(), &root.join("sentence-transformers").join("all-MiniLM-L6-v2"), "minilm-f16.gguf");
    // Broken: a truncated GGUF, safetensors without tokenizer.json, nothing at all, a hidden dir.
    std::fs::create_dir_all(root.join("cut")).unwrap();
    let bytes = small_model("llama", 2, 8).build();
    std::fs::write(root.join("cut").join("cut.gguf"), &bytes[..bytes.len() / 2]).unwrap();
    std::fs::create_dir_all(root.join("st")).unwrap();
    std::fs::write(root.join("st").join("config.json"), b"{\"model_type\":\"llama\"}").unwrap();
    std::fs::write(root.join("st").join("model.safetensors"), b"x").unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    link(&smollm2(), &root.join(".cache"), "hidden.gguf");
    std::fs::write(root.join("stray.gguf"), b"GGUF").unwrap();

    assert_eq!(listed(&store), ["sentence-transformers/all-MiniLM-L6-v2", "smollm2"]);

    let err = store.resolve("cut").unwrap_err();
    let StoreError::Gguf { path, source } = &err else { panic!("{err}") };
    assert_eq!((path.as_path(), source.kind()), (root.join("cut").join("cut.gguf").as_path(), GgufErrorKind::Corrupt));
    assert!(matches!(store.resolve("empty").unwrap_err(), StoreError::NoModelFiles { .. }));
    assert!(matches!(store.resolve("absent").unwrap_err(), StoreError::NotFound { name, .. } if name == "absent"));
}

#[test]
fn a_file_that_is_not_gguf_is_told_apart_from_a_corrupt_one() {
    let (_tmp, store) = new_store();
    let dir = store.root().join("fake");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model.gguf"), b"<html>404 Not Found</html>").unwrap();
    match store.resolve("fake").unwrap_err() {
        StoreError::Gguf { source, .. } => assert_eq!(source.kind(), GgufErrorKind::NotGguf),
        other => panic!("{other}"),
    }
}

#[test]
fn names_cannot_escape_the_root() {
    let (tmp, store) = new_store();
    // A real model just outside the root: no name may reach it.
    link(&tiny_llama(), &tmp.path().join("outside"), "outside.gguf");
    let cases: [(&str, NameProblem); 7] = [
        ("../outside", NameProblem::ParentDir),
        ("org/../../outside", NameProblem::ParentDir),
        ("..", NameProblem::ParentDir),
        ("/etc/passwd", NameProblem::Absolute),
        ("outside\0", NameProblem::Nul),
        ("..\\outside", NameProblem::Backslash),
        (".", NameProblem::HiddenSegment { segment: ".".into() }),
    ];
    for (name, problem) in cases {
        match store.resolve(name).unwrap_err() {
            StoreError::Name(e) => assert_eq!((e.name.as_str(), e.problem), (name, problem)),
            other => panic!("{name:?}: {other}"),
        }
        assert!(matches!(store.import_file(name, &tiny_llama()), Err(StoreError::Name(_))), "{name:?}");
    }
    assert!(!Path::new("/etc/passwd.gguf").exists());
    assert_eq!(std::fs::read_dir(store.root()).unwrap().count(), 0, "nothing was written in the store");
}

#[test]
fn a_model_described_from_a_list_of_files_ignores_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("q")).unwrap();
    small_model("llama", 3, 8).write(&dir.join("q/m-Q4_1.gguf"));
    small_model("llama", 7, 8).write(&dir.join("q/m-Q8_0.gguf"));
    small_model("clip", 1, 8).write(&dir.join("q/mmproj-f16.gguf"));
    // Only the listed files count: the other quantization beside it changes nothing.
    let d = ModelDescriptor::from_files("m".into(), dir, "q/m-Q4_1.gguf", &["q/m-Q4_1.gguf"]).unwrap();
    assert_eq!((d.name.as_str(), d.primary_file.clone(), d.mmproj.clone()), ("m", dir.join("q/m-Q4_1.gguf"), None));
    assert_eq!(d.quantization.as_deref(), Some("Q4_1"));
    let d =
        ModelDescriptor::from_files("m".into(), dir, "q/m-Q4_1.gguf", &["q/m-Q4_1.gguf", "q/mmproj-f16.gguf"]).unwrap();
    assert_eq!(d.mmproj, Some(dir.join("q/mmproj-f16.gguf")));
    assert!(d.has(Capability::Vision));

    let err = ModelDescriptor::from_files("m".into(), dir, "q/absent.gguf", &["q/absent.gguf"]).unwrap_err();
    assert!(err.to_string().contains("absent.gguf"), "{err}");
    std::fs::write(dir.join("notes.txt"), "x").unwrap();
    let err = ModelDescriptor::from_files("m".into(), dir, "notes.txt", &["notes.txt"]).unwrap_err();
    assert!(matches!(err, StoreError::NoModelFiles { .. }), "{err}");
}
