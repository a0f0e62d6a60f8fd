//! Fuzzing model registration (issue 16: untrusted input never crashes anything), the router's
//! `POST /v0/models`:
//!
//! - The request body: the seeds of `tests/fuzz-seeds/registration/` (a registration by
//!   repository, path and URL each) mutated as JSON documents and as bytes, parsed as the
//!   endpoint parses it (`llmr_openai::parse_body`) and, when it parses, registered by
//!   `Registrar::manifest` against a hub mirror on loopback serving two small repositories.
//!   Nothing leaves this machine or the test's folder: before a request is registered, an
//!   absolute `path` the router would accept is moved under the test's folder, and the host and
//!   port of an http(s) `url` become the mirror's (what the router checks about them, before any
//!   I/O, is unchanged).
//! - What a registration reads from the files it registers, which come from outside too: the
//!   `config.json`, `tokenizer_config.json` and `model.safetensors.index.json` of a safetensors
//!   directory (seeds: `tests/fuzz-seeds/repo-files/`) and the GGUF whose head is read (seeds:
//!   the model store's, `crates/model-store/tests/fuzz-seeds/gguf/`), mutated, then registered
//!   by path.
//!
//! Property: every registration answers (a manifest or a `RegisterError`) without a panic on any
//! thread (a panicking blocking task would otherwise become a 500), within the watchdog's time;
//! a manifest lists its primary file and only plain relative paths.
//!
//! `LLMR_FUZZ_CASES=N` or `LLMR_FUZZ_SECS=S` for longer runs (`scripts/fuzz`).

#[path = "../../../tests/fuzz/harness.rs"]
mod harness;

use harness::{fuzz, json_inputs, load_seeds, mutated, note, odd_string, watch};
use llmr_cluster::{check_relative_path, ModelManifest, RegisterModel};
use llmr_hub::Url;
use llmr_hub_mirror::HubMirror;
use llmr_router::registration::{RegisterError, Registrar};
use proptest::prelude::*;
use std::cell::{Cell, RefCell};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

const NOW: u64 = 1_700_000_000;
const INDEX: &str = "model.safetensors.index.json";
const SHARDS: [&str; 2] = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
const GGUF: &str = "model-Q4_K_M.gguf";
/// Cases per hub mirror: a mirror logs every request, so a long run starts fresh ones.
const CASES_PER_MIRROR: u32 = 2000;

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The seed files of `tests/fuzz-seeds/<kind>/` whose names start with `prefix`.
fn seeds(dir: &Path, prefix: &str) -> Arc<Vec<Vec<u8>>> {
    Arc::new(load_seeds(dir).into_iter().filter(|(name, _)| name.starts_with(prefix)).map(|(_, b)| b).collect())
}

fn registration_seeds() -> Arc<Vec<Vec<u8>>> {
    seeds(&manifest_dir().join("tests/fuzz-seeds/registration"), "")
}

fn repo_file_seeds(prefix: &str) -> Arc<Vec<Vec<u8>>> {
    seeds(&manifest_dir().join("tests/fuzz-seeds/repo-files"), prefix)
}

fn gguf_seeds() -> Arc<Vec<Vec<u8>>> {
    seeds(&manifest_dir().join("../model-store/tests/fuzz-seeds/gguf"), "")
}

/// The seed GGUF with `general.file_type` Q4_K_M.
fn llama_gguf() -> Vec<u8> {
    std::fs::read(manifest_dir().join("../model-store/tests/fuzz-seeds/gguf/llama-q4_k_m.gguf")).unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// A GGUF model directory and a sharded safetensors one, from the seeds.
fn model_dirs(gguf: &Path, sharded: &Path) {
    write(gguf, GGUF, &llama_gguf());
    write(gguf, "config.json", &repo_file_seeds("config")[0]);
    write(gguf, "tokenizer_config.json", &repo_file_seeds("tokenizer_config")[0]);
    write(sharded, "config.json", &repo_file_seeds("config")[0]);
    write(sharded, "tokenizer.json", br#"{"model": {"type": "BPE", "vocab": {}, "merges": []}}"#);
    write(sharded, "tokenizer_config.json", &repo_file_seeds("tokenizer_config")[0]);
    write(sharded, INDEX, &repo_file_seeds(INDEX)[0]);
    for shard in SHARDS {
        write(sharded, shard, b"\x02\0\0\0\0\0\0\0{}");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("fuzz-runtime")
        .enable_all()
        .build()
        .unwrap()
}

/// What must hold of any registration's outcome.
fn check_outcome(result: &Result<ModelManifest, RegisterError>) -> Result<(), TestCaseError> {
    note(&match result {
        Ok(_) => "ok".to_string(),
        Err(e) => format!("{} {}", e.status(), e.param().unwrap_or("-")),
    });
    match result {
        Ok(m) => {
            prop_assert!(
                m.files.iter().any(|f| f.path == m.primary),
                "primary {:?} not among {:?}",
                m.primary,
                m.files
            );
            for f in &m.files {
                prop_assert!(check_relative_path(&f.path).is_ok(), "manifest path {:?}", f.path);
            }
        }
        Err(e) => {
            let message = e.to_string();
            prop_assert!(
                !(e.status() == 500 && (message.contains("panicked") || message.contains("blocking task failed"))),
                "a task panicked: {}",
                message
            );
        }
    }
    Ok(())
}

// ---- the request body ----

/// A hub mirror and a registrar using it.
struct Hub {
    mirror: HubMirror,
    registrar: Registrar,
    port: u16,
}

impl Hub {
    fn start(root: &Path) -> Self {
        let repos = vec![
            ("testorg/gguf".to_string(), root.join("models/gguf")),
            ("testorg/sharded".to_string(), root.join("models/sharded")),
        ];
        let mirror = HubMirror::start_blocking(repos).unwrap();
        let endpoint = mirror.endpoint();
        let port = Url::parse(&endpoint).unwrap().port().unwrap();
        Self { registrar: Registrar::new(endpoint, None), mirror, port }
    }
}

/// Keeps a request's I/O on this machine and in the test's folder, changing nothing the router
/// checks before any I/O: an absolute path the router would accept is moved under `root`; an
/// http(s) URL's host and port become the mirror's.
fn confine(req: &mut RegisterModel, root: &Path, port: u16) {
    if let Some(path) = &req.path {
        let p = Path::new(path);
        let accepted =
            p.is_absolute() && !p.components().any(|c| matches!(c, Component::ParentDir | Component::CurDir));
        if accepted {
            req.path = Some(format!("{}{path}", root.display()));
        }
    }
    if let Some(url) = &req.url {
        if let Ok(mut u) = Url::parse(url) {
            if matches!(u.scheme(), "http" | "https") {
                let moved = u.set_host(Some("127.0.0.1")).is_ok() && u.set_port(Some(port)).is_ok();
                req.url = Some(if moved { u.to_string() } else { format!("http://127.0.0.1:{port}/x.gguf") });
            }
        }
    }
}

/// A field: absent, one of `known`, or an odd string.
fn field(known: &'static [&'static str]) -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        3 => Just(None),
        4 => prop::sample::select(known).prop_map(|s| Some(s.to_string())),
        2 => odd_string().prop_map(Some),
    ]
}

/// Requests built field by field, so that they get past the body's parsing into the checks.
fn typed_requests() -> impl Strategy<Value = Vec<u8>> {
    let source = prop_oneof![
        field(&["testorg/gguf", "testorg/sharded", "testorg/missing", "testorg", "a/b/c"]).prop_map(|v| ("repo", v)),
        field(&["/models/gguf", "/models/sharded", "/models/gguf/model-Q4_K_M.gguf", "/models", "/", "models/gguf"])
            .prop_map(|v| ("path", v)),
        field(&[
            "http://127.0.0.1/testorg/gguf/resolve/main/model-Q4_K_M.gguf",
            "https://127.0.0.1/testorg/gguf/resolve/main/model-Q4_K_M.gguf",
            "http://127.0.0.1/testorg/gguf/resolve/main/%2e%2e%2Fmodel.gguf",
            "http://127.0.0.1/testorg/gguf/resolve/main/missing.gguf?download=1",
            "ftp://127.0.0.1/model.gguf",
            "file:///models/gguf/model-Q4_K_M.gguf",
        ])
        .prop_map(|v| ("url", v)),
    ];
    (
        prop::collection::vec(source, 1..3),
        field(&["llama", "org/llama:q4", "a:b", "../x", "x/"]),
        field(&["gguf", "safetensors", "ggml", "onnx", "GGUF"]),
        field(&["model-Q4_K_M.gguf", "config.json", "sub/model.gguf", "model-00001-of-00002.safetensors"]),
        field(&["Q4_K_M", "Q8_0", "q4_k_m", "Q4 K"]),
        field(&["main", "0123456789abcdef0123456789abcdef01234567", "refs/pr/1", "../main"]),
    )
        .prop_map(|(sources, name, format, file, quantization, revision)| {
            let mut body = serde_json::Map::new();
            for (key, value) in sources.into_iter().chain([
                ("name", name),
                ("format", format),
                ("file", file),
                ("quantization", quantization),
                ("revision", revision),
            ]) {
                if let Some(value) = value {
                    body.insert(key.to_string(), value.into());
                }
            }
            serde_json::to_vec(&body).unwrap()
        })
}

#[test]
fn fuzz_registration_requests() {
    let root = tempfile::tempdir().unwrap();
    model_dirs(&root.path().join("models/gguf"), &root.path().join("models/sharded"));
    let rt = runtime();
    let hub = RefCell::new(Hub::start(root.path()));
    let cases = Cell::new(0u32);
    let bodies = prop_oneof![json_inputs(registration_seeds()), typed_requests()];
    fuzz("registration-request", 1500, bodies, |body| {
        cases.set(cases.get() + 1);
        if cases.get().is_multiple_of(CASES_PER_MIRROR) {
            let fresh = Hub::start(root.path());
            drop(std::mem::replace(&mut *hub.borrow_mut(), fresh));
        }
        let Ok(mut req) = watch(&body, || llmr_openai::parse_body::<RegisterModel>(&body)) else {
            note("body refused");
            return Ok(());
        };
        let hub = hub.borrow();
        confine(&mut req, root.path(), hub.port);
        let result = watch(&body, || rt.block_on(hub.registrar.manifest(&req, NOW)));
        let _ = result.as_ref().map_err(|e| (e.param(), e.code(), e.to_string()));
        check_outcome(&result)
    });
}

#[test]
fn registration_seeds_register() {
    let root = tempfile::tempdir().unwrap();
    model_dirs(&root.path().join("models/gguf"), &root.path().join("models/sharded"));
    let rt = runtime();
    let hub = Hub::start(root.path());
    let dir = manifest_dir().join("tests/fuzz-seeds/registration");
    for (name, body) in load_seeds(&dir) {
        let mut req: RegisterModel = llmr_openai::parse_body(&body).unwrap_or_else(|e| panic!("{name}: {}", e.message));
        confine(&mut req, root.path(), hub.port);
        let result = rt.block_on(hub.registrar.manifest(&req, NOW));
        check_outcome(&result).unwrap();
        // The speech seed asks for a format the repository does not have.
        assert_eq!(result.is_ok(), !name.contains("speech"), "{name}: {:?}", result.err().map(|e| e.to_string()));
    }
    assert!(!hub.mirror.requests().is_empty());
}

// ---- the files a registration reads ----

#[derive(Clone, Copy, Debug)]
enum Slot {
    Gguf,
    GgufTokenizerConfig,
    Config,
    TokenizerConfig,
    Index,
}

fn content_inputs() -> impl Strategy<Value = (Slot, bool, Vec<u8>)> {
    let as_file = any::<bool>();
    prop_oneof![
        3 => (mutated(gguf_seeds()), as_file).prop_map(|(b, f)| (Slot::Gguf, f, b)),
        1 => json_inputs(repo_file_seeds("tokenizer_config")).prop_map(|b| (Slot::GgufTokenizerConfig, false, b)),
        2 => json_inputs(repo_file_seeds("config")).prop_map(|b| (Slot::Config, false, b)),
        2 => json_inputs(repo_file_seeds("tokenizer_config")).prop_map(|b| (Slot::TokenizerConfig, false, b)),
        2 => json_inputs(repo_file_seeds(INDEX)).prop_map(|b| (Slot::Index, false, b)),
    ]
}

#[test]
fn fuzz_registered_files() {
    let root = tempfile::tempdir().unwrap();
    let (gguf, sharded): (PathBuf, PathBuf) = (root.path().join("gguf"), root.path().join("sharded"));
    let rt = runtime();
    // Path registrations never reach the hub.
    let registrar = Registrar::new("http://127.0.0.1:9".into(), None);
    fuzz("registration-files", 1500, content_inputs(), |(slot, as_file, bytes)| {
        model_dirs(&gguf, &sharded);
        let (dir, name) = match slot {
            Slot::Gguf => (&gguf, GGUF),
            Slot::GgufTokenizerConfig => (&gguf, "tokenizer_config.json"),
            Slot::Config => (&sharded, "config.json"),
            Slot::TokenizerConfig => (&sharded, "tokenizer_config.json"),
            Slot::Index => (&sharded, INDEX),
        };
        write(dir, name, &bytes);
        let path = if as_file { dir.join(GGUF) } else { dir.clone() };
        let req = RegisterModel { path: Some(path.to_str().unwrap().to_string()), ..RegisterModel::default() };
        let result = watch(&bytes, || rt.block_on(registrar.manifest(&req, NOW)));
        check_outcome(&result)
    });
}
