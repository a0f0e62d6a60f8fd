//! Model registration against a Hugging Face compatible hub (`llmr-hub-mirror`) serving the
//! real SmolLM2 GGUF from `scripts/fetch-models` and small synthetic safetensors repositories,
//! plus registrations by path and by URL.

use llmr_cluster::{ModelFormat, ModelManifest, ModelSource, RegisterModel};
use llmr_hub_mirror::{link, real_model, recorded_sha256, HubMirror};
use llmr_router::registration::{RegisterError, Registrar};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const SMOL_REPO: &str = "testorg/SmolLM2-135M-Instruct-GGUF";
const SMOL_FILE: &str = "SmolLM2-135M-Instruct-Q4_1.gguf";
const SMOL_SIZE: u64 = 98_362_432;
const NOW: u64 = 1_700_000_000;

fn smollm2() -> PathBuf {
    real_model("smollm2", "smollm2-135m-instruct-q4_1.gguf")
}

fn tiny() -> PathBuf {
    real_model("tiny", "tiny-random-llama.gguf")
}

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn write(dir: &Path, path: &str, bytes: &[u8]) {
    let path = dir.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// A valid safetensors file with one F32 tensor of `n` elements.
fn safetensors(n: usize) -> Vec<u8> {
    let header = format!(r#"{{"w":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{}]}}}}"#, n * 4);
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend((0..n).flat_map(|i| (i as f32).to_le_bytes()));
    bytes
}

const CONFIG: &[u8] = br#"{"model_type": "llama", "torch_dtype": "bfloat16", "architectures": ["LlamaForCausalLM"]}"#;
const TOKENIZER: &[u8] = br#"{"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}"#;
const TOKENIZER_CONFIG: &[u8] =
    br#"{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}", "eos_token": "</s>"}"#;

/// The SmolLM2 GGUF repository: the model (linked), configs, a README and a projector.
fn smol_repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    link(&smollm2(), &dir.path().join(SMOL_FILE));
    write(dir.path(), "config.json", br#"{"model_type": "llama"}"#);
    write(dir.path(), "tokenizer_config.json", br#"{"eos_token": "<|im_end|>"}"#);
    write(dir.path(), "README.md", b"# SmolLM2");
    write(dir.path(), "mmproj-SmolLM2-f16.gguf", b"GGUF not really");
    dir
}

/// A sharded safetensors repository; the second shard is over the LFS threshold.
fn sharded_repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "config.json", CONFIG);
    write(dir.path(), "tokenizer.json", TOKENIZER);
    write(dir.path(), "tokenizer_config.json", TOKENIZER_CONFIG);
    write(dir.path(), "generation_config.json", br#"{"max_new_tokens": 32}"#);
    write(dir.path(), "README.md", b"# synthetic");
    write(dir.path(), "model-00001-of-00002.safetensors", &safetensors(16));
    write(dir.path(), "model-00002-of-00002.safetensors", &safetensors(3 << 20));
    let index = br#"{"metadata": {"total_size": 12582976}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#;
    write(dir.path(), "model.safetensors.index.json", index);
    dir
}

fn repo(id: &str) -> RegisterModel {
    RegisterModel { repo: Some(id.into()), ..RegisterModel::default() }
}

async fn mirror(repos: &[(&str, &Path)]) -> HubMirror {
    HubMirror::start(repos.iter().map(|(id, dir)| (id.to_string(), dir.to_path_buf())).collect()).await.unwrap()
}

async fn register(hub: &HubMirror, req: &RegisterModel) -> Result<ModelManifest, RegisterError> {
    Registrar::new(hub.endpoint(), None).manifest(req, NOW).await
}

fn refused(result: Result<ModelManifest, RegisterError>) -> (u16, &'static str, String) {
    let e = result.expect_err("the registration should be refused");
    (e.status(), e.param().unwrap_or("-"), e.to_string())
}

fn file<'m>(m: &'m ModelManifest, path: &str) -> &'m llmr_cluster::ManifestFile {
    m.files.iter().find(|f| f.path == path).unwrap_or_else(|| panic!("{path} is not in {:?}", m.files))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_repository_gets_its_hashes_from_the_listing_and_facts_from_the_head() {
    let dir = smol_repo();
    let hub = mirror(&[(SMOL_REPO, dir.path())]).await;
    let m = register(&hub, &repo(SMOL_REPO)).await.unwrap();

    assert_eq!((m.name.as_str(), m.format, m.primary.as_str()), (SMOL_REPO, ModelFormat::Gguf, SMOL_FILE));
    let paths: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, [SMOL_FILE, "config.json", "tokenizer_config.json"], "no README, no projector");
    let gguf = file(&m, SMOL_FILE);
    assert_eq!((gguf.size, gguf.sha256.clone()), (SMOL_SIZE, recorded_sha256(&smollm2())));
    assert_eq!(file(&m, "config.json").sha256, sha256(br#"{"model_type": "llama"}"#));
    assert_eq!(file(&m, "config.json").size, 23);
    assert_eq!(m.architecture.as_deref(), Some("llama"));
    assert_eq!(m.quantization.as_deref(), Some("Q4_1"));
    assert!(m.has_chat_template, "SmolLM2's GGUF carries its chat template");
    assert_eq!(m.registered_at, NOW);
    match &m.source {
        ModelSource::Hub { endpoint, repo, revision } => {
            assert_eq!((endpoint.as_str(), repo.as_str()), (hub.endpoint().as_str(), SMOL_REPO));
            assert_eq!(revision.len(), 40, "pinned to the listed commit: {revision}");
            let listing = hub.request_log().into_iter().next().unwrap();
            assert_eq!(listing.path, format!("/api/models/{SMOL_REPO}/revision/main"));
            assert_eq!(listing.query.as_deref(), Some("blobs=true"));
        }
        other => panic!("{other:?}"),
    }

    // The model itself was only read in ranges of its head; the README never.
    let log = hub.request_log();
    let model_reads: Vec<_> = log.iter().filter(|r| r.path.ends_with(SMOL_FILE)).collect();
    assert!(!model_reads.is_empty());
    for read in &model_reads {
        let range = read.range.as_deref().unwrap_or_else(|| panic!("a whole-file read: {read:?}"));
        let end: u64 = range.rsplit('-').next().unwrap().parse().unwrap();
        assert!(end < 64 << 20, "{range}");
    }
    assert!(!log.iter().any(|r| r.path.ends_with("README.md") || r.path.contains("mmproj")), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quantization_and_file_choose_among_ggufs() {
    let dir = smol_repo();
    link(&tiny(), &dir.path().join("tiny/tiny-random-llama-Q8_0.gguf"));
    let hub = mirror(&[(SMOL_REPO, dir.path())]).await;

    let m = register(&hub, &repo(SMOL_REPO)).await.unwrap();
    assert_eq!(m.primary, "tiny/tiny-random-llama-Q8_0.gguf", "Q8_0 is preferred without a tag, as in `llmr pull`");
    assert_eq!(file(&m, &m.primary).sha256, recorded_sha256(&tiny()));

    let q4_1 = RegisterModel { quantization: Some("Q4_1".into()), name: Some("smol:Q4_1".into()), ..repo(SMOL_REPO) };
    let m = register(&hub, &q4_1).await.unwrap();
    assert_eq!((m.name.as_str(), m.primary.as_str()), ("smol:Q4_1", SMOL_FILE));

    let by_file = RegisterModel { file: Some(SMOL_FILE.into()), ..repo(SMOL_REPO) };
    assert_eq!(register(&hub, &by_file).await.unwrap().primary, SMOL_FILE);

    let (status, param, message) =
        refused(register(&hub, &RegisterModel { quantization: Some("Q5_0".into()), ..repo(SMOL_REPO) }).await);
    assert_eq!((status, param), (400, "quantization"));
    assert!(message.contains(SMOL_FILE) && message.contains("tiny/tiny-random-llama-Q8_0.gguf"), "{message}");
    let (status, param, _) =
        refused(register(&hub, &RegisterModel { file: Some("absent.gguf".into()), ..repo(SMOL_REPO) }).await);
    assert_eq!((status, param), (404, "file"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_safetensors_repository_lists_the_index_and_every_shard() {
    let dir = sharded_repo();
    let hub = mirror(&[("testorg/sharded", dir.path())]).await;
    let m = register(&hub, &repo("testorg/sharded")).await.unwrap();

    assert_eq!((m.format, m.primary.as_str()), (ModelFormat::Safetensors, "model.safetensors.index.json"));
    let paths: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ]
    );
    for f in &m.files {
        let bytes = std::fs::read(dir.path().join(&f.path)).unwrap();
        assert_eq!((f.size, f.sha256.as_str()), (bytes.len() as u64, sha256(&bytes).as_str()), "{}", f.path);
    }
    assert_eq!(
        (m.architecture.as_deref(), m.quantization.as_deref(), m.has_chat_template),
        (Some("llama"), Some("bfloat16"), true)
    );
    let log = hub.requests();
    assert!(
        !log.iter().any(|p| p.ends_with("model-00002-of-00002.safetensors")),
        "an LFS file's sha256 comes from the listing, it is not downloaded: {log:?}"
    );
    assert!(log.iter().any(|p| p.ends_with("model-00001-of-00002.safetensors")), "a small file is hashed: {log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safetensors_rules_and_the_format_choice_are_enforced() {
    let both = sharded_repo();
    link(&smollm2(), &both.path().join("gguf").join(SMOL_FILE));
    let no_tokenizer = tempfile::tempdir().unwrap();
    write(no_tokenizer.path(), "config.json", CONFIG);
    write(no_tokenizer.path(), "model.safetensors", &safetensors(4));
    let ambiguous = tempfile::tempdir().unwrap();
    write(ambiguous.path(), "config.json", CONFIG);
    write(ambiguous.path(), "tokenizer.json", TOKENIZER);
    write(ambiguous.path(), "a.safetensors", &safetensors(4));
    write(ambiguous.path(), "b.safetensors", &safetensors(4));
    let hub =
        mirror(&[("o/both", both.path()), ("o/no-tokenizer", no_tokenizer.path()), ("o/ambiguous", ambiguous.path())])
            .await;

    let (status, param, message) = refused(register(&hub, &repo("o/both")).await);
    assert_eq!((status, param), (400, "format"));
    assert!(
        message.contains("GGUF (gguf/SmolLM2-135M-Instruct-Q4_1.gguf)") && message.contains("safetensors ("),
        "{message}"
    );
    let gguf = register(&hub, &RegisterModel { format: Some(ModelFormat::Gguf), ..repo("o/both") }).await.unwrap();
    assert_eq!(
        (gguf.primary.as_str(), gguf.quantization.as_deref()),
        ("gguf/SmolLM2-135M-Instruct-Q4_1.gguf", Some("Q4_1"))
    );
    assert!(gguf.has_chat_template);
    let st = register(&hub, &RegisterModel { format: Some(ModelFormat::Safetensors), ..repo("o/both") }).await.unwrap();
    assert_eq!(st.primary, "model.safetensors.index.json");

    let (status, param, message) = refused(register(&hub, &repo("o/no-tokenizer")).await);
    assert_eq!((status, param), (400, "repo"));
    assert!(message.contains("missing: tokenizer.json"), "{message}");
    let (status, _, message) = refused(register(&hub, &repo("o/ambiguous")).await);
    assert_eq!(status, 400);
    assert!(message.contains("ambiguous: a.safetensors, b.safetensors"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_repositories_and_revisions_are_404() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "config.json", b"{}");
    let hub = mirror(&[("o/m", dir.path())]).await;
    let (status, param, message) = refused(register(&hub, &repo("nobody/nothing")).await);
    assert_eq!((status, param), (404, "repo"));
    assert!(message.contains("nobody/nothing"), "{message}");
    let (status, param, _) =
        refused(register(&hub, &RegisterModel { revision: Some("v9".into()), ..repo("o/m") }).await);
    assert_eq!((status, param), (404, "revision"));
    let (status, param, _) = refused(register(&hub, &repo("o/m")).await);
    assert_eq!((status, param), (400, "repo"), "no weights at all");

    let down = Registrar::new("http://127.0.0.1:9".into(), None);
    let e = down.manifest(&repo("o/m"), NOW).await.unwrap_err();
    assert_eq!(e.status(), 502, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_paths_that_could_escape_are_refused() {
    let dir = smol_repo();
    let hub = mirror(&[(SMOL_REPO, dir.path())]).await;
    for (req, field) in [
        (RegisterModel { name: Some("../../etc".into()), ..repo(SMOL_REPO) }, "name"),
        (RegisterModel { name: Some("/abs/name".into()), ..repo(SMOL_REPO) }, "name"),
        (RegisterModel { file: Some("../SmolLM2-135M-Instruct-Q4_1.gguf".into()), ..repo(SMOL_REPO) }, "file"),
        (RegisterModel { file: Some("/etc/passwd".into()), ..repo(SMOL_REPO) }, "file"),
        (repo("../testorg"), "repo"),
        (repo("testorg/../x"), "repo"),
        (RegisterModel { path: Some("/tmp/../etc".into()), ..RegisterModel::default() }, "path"),
        (RegisterModel { path: Some("relative/dir".into()), ..RegisterModel::default() }, "path"),
        (
            RegisterModel { url: Some(format!("{}/a/%2E%2E%2Fx.gguf", hub.endpoint())), ..RegisterModel::default() },
            "url",
        ),
    ] {
        let (status, param, message) = refused(register(&hub, &req).await);
        assert_eq!((status, param), (400, field), "{req:?}: {message}");
    }
    assert!(hub.requests().is_empty(), "refused before any request: {:?}", hub.requests());

    // A hub whose listing names a file outside the repository.
    let hostile = axum::Router::new().route(
        "/api/models/{owner}/{name}/revision/{rev}",
        axum::routing::get(|| async {
            axum::Json(serde_json::json!({
                "id": "evil/repo",
                "siblings": [{"rfilename": "m-Q4_0.gguf", "size": 10}, {"rfilename": "../../../etc/passwd", "size": 10}]
            }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, hostile).await });
    let e = Registrar::new(endpoint, None).manifest(&repo("evil/repo"), NOW).await.unwrap_err();
    assert_eq!((e.status(), e.param()), (400, Some("repo")), "{e}");
    assert!(e.to_string().contains("../../../etc/passwd"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_directory_or_gguf_file_is_hashed_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("tiny-model");
    link(&tiny(), &model_dir.join("tiny-random-llama-Q8_0.gguf"));
    write(&model_dir, "tokenizer_config.json", TOKENIZER_CONFIG);
    write(&model_dir, ".cache/partial.gguf", b"hidden, skipped");
    let registrar = Registrar::new("http://127.0.0.1:9".into(), None);

    let req = RegisterModel { path: Some(model_dir.to_str().unwrap().into()), ..RegisterModel::default() };
    let m = registrar.manifest(&req, NOW).await.unwrap();
    assert_eq!(m.name, "tiny-model", "the directory's name");
    assert_eq!(m.source, ModelSource::Path { dir: model_dir.to_str().unwrap().into() });
    assert_eq!((m.format, m.primary.as_str()), (ModelFormat::Gguf, "tiny-random-llama-Q8_0.gguf"));
    assert_eq!(file(&m, &m.primary).sha256, recorded_sha256(&tiny()));
    assert_eq!(file(&m, "tokenizer_config.json").sha256, sha256(TOKENIZER_CONFIG));
    assert_eq!(m.architecture.as_deref(), Some("llama"));
    assert!(m.has_chat_template, "from tokenizer_config.json");

    let one = model_dir.join("tiny-random-llama-Q8_0.gguf");
    let req = RegisterModel { path: Some(one.to_str().unwrap().into()), ..RegisterModel::default() };
    let m = registrar.manifest(&req, NOW).await.unwrap();
    assert_eq!(m.name, "tiny-random-llama-Q8_0", "the file's stem");
    assert_eq!(m.files.len(), 1);
    assert_eq!(m.files[0].sha256, recorded_sha256(&tiny()));

    let sharded = sharded_repo();
    let req = RegisterModel {
        path: Some(sharded.path().to_str().unwrap().into()),
        name: Some("st".into()),
        ..RegisterModel::default()
    };
    let m = registrar.manifest(&req, NOW).await.unwrap();
    assert_eq!((m.format, m.files.len()), (ModelFormat::Safetensors, 7));

    let missing = RegisterModel { path: Some("/nonexistent/model".into()), ..RegisterModel::default() };
    assert_eq!(refused(registrar.manifest(&missing, NOW).await).0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_uses_the_announced_sha256_or_streams_the_file_through_sha256() {
    let dir = smol_repo();
    link(&tiny(), &dir.path().join("tiny.gguf"));
    let hub = mirror(&[(SMOL_REPO, dir.path())]).await;
    let registrar = Registrar::new("https://hub.invalid".into(), Some("hf_secret".into()));

    let url = format!("{}/{SMOL_REPO}/resolve/main/{SMOL_FILE}", hub.endpoint());
    let m =
        registrar.manifest(&RegisterModel { url: Some(url.clone()), ..RegisterModel::default() }, NOW).await.unwrap();
    assert_eq!((m.name.as_str(), m.primary.as_str()), ("SmolLM2-135M-Instruct-Q4_1", SMOL_FILE));
    assert_eq!(m.source, ModelSource::Url { url });
    assert_eq!((m.files[0].size, m.files[0].sha256.clone()), (SMOL_SIZE, recorded_sha256(&smollm2())));
    assert_eq!(
        (m.architecture.as_deref(), m.quantization.as_deref(), m.has_chat_template),
        (Some("llama"), Some("Q4_1"), true)
    );
    let log = hub.request_log();
    assert!(log.iter().all(|r| r.method == "HEAD" || r.range.is_some()), "X-Linked-Etag spared the download: {log:?}");
    assert!(log.iter().all(|r| r.authorization.is_none()), "the hub token goes to the hub only");

    // No sha256 announced for a small file: it is streamed through sha256.
    let url = format!("{}/{SMOL_REPO}/resolve/main/tiny.gguf", hub.endpoint());
    let m = registrar.manifest(&RegisterModel { url: Some(url), ..RegisterModel::default() }, NOW).await.unwrap();
    assert_eq!(m.files[0].sha256, recorded_sha256(&tiny()));

    let absent = format!("{}/{SMOL_REPO}/resolve/main/absent.gguf", hub.endpoint());
    let (status, param, _) =
        refused(registrar.manifest(&RegisterModel { url: Some(absent), ..RegisterModel::default() }, NOW).await);
    assert_eq!((status, param), (404, "url"));
}

/// whisper.cpp's repository layout (several `ggml-*.bin`) and Piper's (voices in subfolders with
/// their configs), with the real Whisper tiny.en and Piper voice from `scripts/fetch-models`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speech_repositories_register_as_ggml_and_onnx_with_their_files() {
    let whisper = tempfile::tempdir().unwrap();
    link(&real_model("whisper-tiny.en", "whisper/ggml-tiny.en.bin"), &whisper.path().join("ggml-tiny.en.bin"));
    write(whisper.path(), "ggml-base.bin", b"lmgg not really");
    write(whisper.path(), "README.md", b"# whisper.cpp models");
    let voices = tempfile::tempdir().unwrap();
    let voice = "en/en_US/joe/medium/en_US-joe-medium.onnx";
    link(&real_model("piper-joe", "piper-joe/en_US-joe-medium.onnx"), &voices.path().join(voice));
    link(
        &real_model("piper-joe", "piper-joe/en_US-joe-medium.onnx.json"),
        &voices.path().join(format!("{voice}.json")),
    );
    let hub = mirror(&[("ggerganov/whisper.cpp", whisper.path()), ("rhasspy/piper-voices", voices.path())]).await;

    // Two whisper models: the repository alone is ambiguous, `file` picks one.
    let (status, param, _) = refused(register(&hub, &repo("ggerganov/whisper.cpp")).await);
    assert_eq!((status, param), (400, "file"));
    let req = RegisterModel { file: Some("ggml-tiny.en.bin".into()), ..repo("ggerganov/whisper.cpp") };
    let m = register(&hub, &req).await.unwrap();
    assert_eq!(
        (m.format, m.primary.as_str(), m.architecture.as_deref()),
        (ModelFormat::Ggml, "ggml-tiny.en.bin", Some("whisper"))
    );
    assert_eq!((m.files.len(), file(&m, "ggml-tiny.en.bin").size), (1, 77_704_698));

    let m = register(&hub, &repo("rhasspy/piper-voices")).await.unwrap();
    assert_eq!((m.format, m.primary.as_str(), m.architecture.as_deref()), (ModelFormat::Onnx, voice, Some("piper")));
    assert_eq!(m.files.len(), 2);
    assert_eq!(file(&m, voice).sha256, "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06");
    let req = RegisterModel { format: Some(ModelFormat::Gguf), ..repo("rhasspy/piper-voices") };
    assert_eq!(refused(register(&hub, &req).await).1, "format");
}
