//! Importing GGUF files: atomic placement and the refusals that keep a directory unambiguous.

use crate::support::{entries, s, small_model, tiny_llama, GgufWriter};
use llmr_model_store::gguf::GgufErrorKind;
use llmr_model_store::{ModelStore, StoreError};
use std::path::{Path, PathBuf};

fn setup() -> (tempfile::TempDir, ModelStore, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let store = ModelStore::open(tmp.path().join("models")).unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    (tmp, store, src)
}

fn write(dir: &Path, name: &str, w: GgufWriter) -> PathBuf {
    w.write(&dir.join(name))
}

#[test]
fn a_gguf_is_placed_whole_under_its_own_name() {
    let (_tmp, store, src) = setup();
    let file = write(&src, "tiny-Q4_0.gguf", small_model("llama", 2, 8));
    let d = store.import_file("org/tiny", &file).unwrap();
    let dir = store.root().join("org").join("tiny");
    assert_eq!((d.name.as_str(), d.primary_file.as_path()), ("org/tiny", dir.join("tiny-Q4_0.gguf").as_path()));
    assert_eq!(d.quantization.as_deref(), Some("Q4_0"));
    assert_eq!(entries(&dir), ["tiny-Q4_0.gguf"], "no temporary file is left behind");
    assert_eq!(std::fs::read(&d.primary_file).unwrap(), std::fs::read(&file).unwrap());
    assert_eq!(store.resolve("org/tiny").unwrap(), d);
}

#[test]
fn a_second_quantization_is_addressed_by_its_tag() {
    let (_tmp, store, src) = setup();
    store.import_file("m", &write(&src, "m-Q4_0.gguf", small_model("llama", 2, 8))).unwrap();
    let d = store.import_file("m:Q8_0", &write(&src, "m-Q8_0.gguf", small_model("llama", 7, 8))).unwrap();
    assert_eq!(d.name, "m:Q8_0");
    assert!(
        matches!(store.resolve("m").unwrap_err(), StoreError::AmbiguousQuantization { available, .. } if available == ["Q4_0", "Q8_0"])
    );
    assert_eq!(store.resolve("m:Q8_0").unwrap().primary_file, store.root().join("m").join("m-Q8_0.gguf"));
}

#[test]
fn imports_that_would_make_the_directory_ambiguous_are_refused() {
    let (_tmp, store, src) = setup();
    let first = write(&src, "m-Q4_0.gguf", small_model("llama", 2, 8));
    store.import_file("m", &first).unwrap();
    assert!(matches!(store.import_file("m", &first).unwrap_err(), StoreError::AlreadyExists { .. }));
    let same_quant = write(&src, "other-Q4_0.gguf", small_model("llama", 2, 8));
    assert!(matches!(
        store.import_file("m", &same_quant).unwrap_err(),
        StoreError::DuplicateQuantization { quantization: Some(q), .. } if q == "Q4_0"
    ));
    let no_file_type = GgufWriter::new().kv("general.architecture", s("llama"));
    let unknown = write(&src, "unknown.gguf", no_file_type);
    assert!(matches!(store.import_file("m", &unknown).unwrap_err(), StoreError::AmbiguousQuantization { .. }));
    assert_eq!(entries(&store.root().join("m")), ["m-Q4_0.gguf"]);
}

#[test]
fn a_tag_must_match_the_file() {
    let (_tmp, store, src) = setup();
    let file = write(&src, "m.gguf", small_model("llama", 2, 8));
    let err = store.import_file("m:Q4_K_M", &file).unwrap_err();
    assert_eq!(err.to_string(), format!("{} has quantization Q4_0, but the name asks for 'Q4_K_M'", file.display()));
    assert!(!store.root().join("m").exists(), "nothing was created");
}

#[test]
fn damaged_and_foreign_files_are_refused_before_anything_is_written() {
    let (_tmp, store, src) = setup();
    let bytes = small_model("llama", 2, 8).build();
    let cut = src.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
    let html = src.join("page.gguf");
    std::fs::write(&html, b"<html></html>").unwrap();
    for (file, kind) in [(&cut, GgufErrorKind::Corrupt), (&html, GgufErrorKind::NotGguf)] {
        match store.import_file("m", file).unwrap_err() {
            StoreError::Gguf { source, .. } => assert_eq!(source.kind(), kind, "{}", file.display()),
            other => panic!("{other}"),
        }
    }
    let txt = src.join("model.bin");
    std::fs::write(&txt, &bytes).unwrap();
    assert!(matches!(store.import_file("m", &txt).unwrap_err(), StoreError::NotGgufFileName { .. }));
    let proj = write(&src, "mmproj-m.gguf", small_model("clip", 1, 8));
    assert!(matches!(store.import_file("m", &proj).unwrap_err(), StoreError::Projector { .. }));
    assert!(!store.root().join("m").exists());
}

#[test]
fn a_real_model_imports_and_resolves() {
    let (_tmp, store, _src) = setup();
    let d = store.import_file("tiny", &tiny_llama()).unwrap();
    assert_eq!(
        (d.architecture.as_str(), d.quantization.as_deref(), d.context_length),
        ("llama", Some("F16"), Some(2048))
    );
    assert_eq!(d.size_bytes, std::fs::metadata(tiny_llama()).unwrap().len());
    assert_eq!(store.list(), [d]);
}

#[test]
fn a_directory_is_a_model_or_an_organisation_not_both() {
    let (_tmp, store, src) = setup();
    let file = write(&src, "m-Q4_0.gguf", small_model("llama", 2, 8));
    store.import_file("org/m", &file).unwrap();
    assert!(matches!(store.import_file("org", &file).unwrap_err(), StoreError::NamespaceClash { .. }));
    store.import_file("solo", &file).unwrap();
    let err = store.import_file("solo/m", &file).unwrap_err();
    assert!(matches!(&err, StoreError::NamespaceClash { other, .. } if other == &store.root().join("solo")), "{err}");
    let mut names: Vec<String> = store.list().into_iter().map(|d| d.name).collect();
    names.sort();
    assert_eq!(names, ["org/m", "solo"]);
}
