//! `pull`: downloads from a Hugging Face compatible hub served on 127.0.0.1 by the test itself
//! (the model listing, `resolve/main` with Content-Length, Range, redirects and `X-Linked-Etag`),
//! with the real SmolLM2 GGUF from `scripts/fetch-models` as the file served; and through the
//! hub mirror.

use crate::support::{entries, link, smollm2, tiny};
use llmr_hub::pull::{PullError, PullSpec, Pulled};
use llmr_hub::{partial_path_for, Hub, HubError};
use llmr_hub_mirror::HubMirror;
use llmr_model_store::{ModelName, ModelStore};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

const REPO: &str = "testorg/SmolLM2-135M-Instruct-GGUF";
const FILE: &str = "SmolLM2-135M-Instruct-Q4_1.gguf";
const SIZE: u64 = 98_362_432;

#[derive(Clone)]
enum Body {
    File(PathBuf),
    Bytes(Vec<u8>),
    /// Listed, but `resolve` answers 404.
    Missing,
}

#[derive(Clone, Copy, PartialEq)]
enum Etag {
    None,
    Real,
    Wrong,
}

#[derive(Clone)]
struct Config {
    repos: HashMap<String, Vec<(String, Body)>>,
    etag: Etag,
    /// Answer `resolve` with a 302 to `/cdn/...`, as huggingface.co does for LFS files.
    redirect: bool,
    /// Close the first file download after this many body bytes.
    cut_first_download_at: Option<u64>,
    token: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self { repos: HashMap::new(), etag: Etag::Real, redirect: false, cut_first_download_at: None, token: None }
    }
}

#[derive(Clone, Debug)]
struct Logged {
    path: String,
    range: Option<String>,
    authorization: Option<String>,
}

struct TestHub {
    url: String,
    log: Arc<Mutex<Vec<Logged>>>,
}

impl TestHub {
    fn start(config: Config) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let state = Arc::new(State { config, log: log.clone(), downloads: Mutex::new(0) });
        // Ends with the test process; it only answers connections the test makes.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = state.clone();
                std::thread::spawn(move || {
                    let _ = state.handle(stream);
                });
            }
        });
        Self { url, log }
    }

    fn client(&self) -> Hub {
        Hub::new(&self.url, None).unwrap()
    }

    fn requests(&self, containing: &str) -> Vec<Logged> {
        self.log.lock().unwrap().iter().filter(|r| r.path.contains(containing)).cloned().collect()
    }
}

struct State {
    config: Config,
    log: Arc<Mutex<Vec<Logged>>>,
    downloads: Mutex<u32>,
}

fn respond(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (name, value) in headers {
        head += &format!("{name}: {value}\r\n");
    }
    stream.write_all(head.as_bytes())?;
    stream.write_all(b"\r\n")?;
    stream.write_all(body)
}

impl State {
    fn handle(&self, mut stream: TcpStream) -> io::Result<()> {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut request_line = String::new();
        reader.read_line(&mut request_line)?;
        let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let mut headers = HashMap::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
            }
        }
        let logged = Logged {
            path: path.clone(),
            range: headers.get("range").cloned(),
            authorization: headers.get("authorization").cloned(),
        };
        self.log.lock().unwrap().push(logged.clone());

        let cdn = path.starts_with("/cdn/");
        if !cdn && self.config.token.as_ref().is_some_and(|t| logged.authorization != Some(format!("Bearer {t}"))) {
            return respond(&mut stream, "401 Unauthorized", &[], br#"{"error":"Invalid credentials"}"#);
        }
        // `/api/models/{repo}/revision/main?blobs=true`, as the client lists a repository.
        let listing = path.split('?').next().and_then(|p| p.strip_prefix("/api/models/"));
        if let Some(repo) = listing.map(|l| l.trim_end_matches("/revision/main")) {
            let Some(files) = self.config.repos.get(repo) else {
                return respond(&mut stream, "404 Not Found", &[], br#"{"error":"Repository not found"}"#);
            };
            let siblings: Vec<_> = files.iter().map(|(name, _)| serde_json::json!({ "rfilename": name })).collect();
            let body = serde_json::json!({ "id": repo, "siblings": siblings }).to_string();
            return respond(&mut stream, "200 OK", &[("Content-Type", "application/json".into())], body.as_bytes());
        }
        // `owner/repo/path/file`, from `/owner/repo/resolve/main/path/file` or `/cdn/owner/repo/path/file`.
        let target = match path.strip_prefix("/cdn/") {
            Some(target) => target.to_string(),
            None => path.trim_start_matches('/').replacen("/resolve/main", "", 1),
        };
        let found = self.config.repos.iter().find_map(|(repo, files)| {
            let file = target.strip_prefix(repo.as_str())?.strip_prefix('/')?;
            files.iter().find(|(name, _)| name == file).map(|(_, body)| body.clone())
        });
        let body = match found {
            Some(Body::Missing) | None => return respond(&mut stream, "404 Not Found", &[], b"Entry not found"),
            Some(body) => body,
        };
        let (len, sha) = match &body {
            Body::File(p) => (std::fs::metadata(p)?.len(), smollm2_sha256().to_string()),
            Body::Bytes(b) => (b.len() as u64, format!("{:x}", Sha256::digest(b))),
            Body::Missing => unreachable!(),
        };
        let etag = match self.config.etag {
            Etag::None => None,
            Etag::Real => Some(format!("\"{sha}\"")),
            Etag::Wrong => Some(format!("\"{}\"", "0".repeat(64))),
        };
        let is_gguf = target.ends_with(".gguf");
        let mut linked = vec![("X-Linked-Size", len.to_string())];
        linked.extend(etag.clone().filter(|_| is_gguf).map(|e| ("X-Linked-Etag", e)));
        if self.config.redirect && !cdn {
            linked.push(("Location", format!("/cdn/{target}")));
            return respond(&mut stream, "302 Found", &linked, b"");
        }

        let start: u64 = match logged.range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
            Some(r) => r.trim_end_matches('-').parse().unwrap(),
            None => 0,
        };
        if start >= len && start > 0 {
            return respond(
                &mut stream,
                "416 Range Not Satisfiable",
                &[("Content-Range", format!("bytes */{len}"))],
                b"",
            );
        }
        let mut head = if start > 0 {
            format!("HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{}/{len}\r\n", len - 1)
        } else {
            "HTTP/1.1 200 OK\r\n".to_string()
        };
        head += &format!("Content-Length: {}\r\nConnection: close\r\n", len - start);
        if !cdn {
            for (name, value) in &linked {
                head += &format!("{name}: {value}\r\n");
            }
        }
        head += "\r\n";
        stream.write_all(head.as_bytes())?;
        let mut send = len - start;
        if is_gguf {
            let mut downloads = self.downloads.lock().unwrap();
            *downloads += 1;
            if let (1, Some(cut)) = (*downloads, self.config.cut_first_download_at) {
                send = cut - start;
            }
        }
        match body {
            Body::File(p) => {
                let mut file = File::open(p)?;
                file.seek(SeekFrom::Start(start))?;
                io::copy(&mut file.take(send), &mut stream)?;
            }
            Body::Bytes(b) => stream.write_all(&b[start as usize..(start + send) as usize])?,
            Body::Missing => unreachable!(),
        }
        stream.flush()
    }
}

fn smollm2_sha256() -> &'static str {
    static SHA: OnceLock<String> = OnceLock::new();
    SHA.get_or_init(|| {
        let mut hasher = Sha256::new();
        io::copy(&mut File::open(smollm2()).unwrap(), &mut hasher).unwrap();
        format!("{:x}", hasher.finalize())
    })
}

fn smollm2_repo() -> Vec<(String, Body)> {
    vec![
        ("README.md".into(), Body::Bytes(b"# SmolLM2 GGUF".to_vec())),
        ("config.json".into(), Body::Bytes(br#"{"model_type": "llama"}"#.to_vec())),
        ("tokenizer_config.json".into(), Body::Bytes(br#"{"eos_token": "<|im_end|>"}"#.to_vec())),
        (FILE.into(), Body::File(smollm2())),
        ("SmolLM2-135M-Instruct-Q8_0.gguf".into(), Body::Missing),
    ]
}

fn config(repos: &[(&str, Vec<(String, Body)>)]) -> Config {
    let repos = repos.iter().map(|(r, files)| (r.to_string(), files.clone())).collect();
    Config { repos, ..Config::default() }
}

fn store() -> (tempfile::TempDir, ModelStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = ModelStore::open(dir.path()).unwrap();
    (dir, store)
}

fn model_dir(store: &ModelStore, name: &str) -> PathBuf {
    store.model_dir(&ModelName::parse(name).unwrap())
}

async fn pull(hub: &TestHub, store: &ModelStore, spec: &str) -> Result<Pulled, PullError> {
    let spec = PullSpec::parse(spec)?;
    let client = hub.client();
    let remote = client.locate(&spec).await?;
    client.pull(store, &remote, &spec.repo, |_, _| {}).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_by_quantization_tag_and_the_store_then_resolves_it() {
    let hub = TestHub::start(Config { redirect: true, ..config(&[(REPO, smollm2_repo())]) });
    let (_tmp, store) = store();
    let client = hub.client();
    let spec = PullSpec::parse(&format!("{REPO}:Q4_1")).unwrap();
    let remote = client.locate(&spec).await.unwrap();
    assert_eq!(remote.path, FILE);

    let mut reports = Vec::new();
    let pulled = client.pull(&store, &remote, &spec.repo, |done, total| reports.push((done, total))).await.unwrap();
    assert!(!pulled.already_present);
    let d = &pulled.descriptor;
    assert_eq!((d.name.as_str(), d.architecture.as_str(), d.quantization.as_deref()), (REPO, "llama", Some("Q4_1")));
    assert_eq!(d.size_bytes, SIZE);
    assert_eq!(reports.last(), Some(&(SIZE, Some(SIZE))));
    assert!(reports.windows(2).all(|w| w[0].0 <= w[1].0), "progress only moves forward");
    assert_eq!(pulled.extras, ["config.json", "tokenizer_config.json"]);

    let dir = model_dir(&store, REPO);
    assert_eq!(entries(&dir), [FILE, "config.json", "tokenizer_config.json"], "no staging or partial file is left");
    let resolved = store.resolve(REPO).unwrap();
    assert_eq!((resolved.architecture.as_str(), resolved.primary_file.clone()), ("llama", dir.join(FILE)));
    assert_eq!(store.resolve(&format!("{REPO}:Q4_1")).unwrap().primary_file, dir.join(FILE));
    let listed = store.list();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].name.as_str(), listed[0].architecture.as_str()), (REPO, "llama"));

    assert!(hub.requests("Q8_0").is_empty(), "only the chosen file is downloaded");
    assert_eq!(hub.requests(&format!("/cdn/{REPO}/{FILE}")).len(), 1, "the redirect is followed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_an_exact_path_under_another_name_once() {
    let files = vec![
        ("README.md".to_string(), Body::Bytes(b"hi".to_vec())),
        ("gguf/smollm2.Q4_1.gguf".to_string(), Body::File(smollm2())),
        ("gguf/smollm2.Q5_0.gguf".to_string(), Body::Missing),
    ];
    let hub = TestHub::start(Config { etag: Etag::None, ..config(&[("testorg/smol", files)]) });
    let (_tmp, store) = store();
    let client = hub.client();
    let spec = PullSpec::parse("testorg/smol/gguf/smollm2.Q4_1.gguf").unwrap();
    let remote = client.locate(&spec).await.unwrap();
    let name = ModelName::parse("smol").unwrap();
    let pulled = client.pull(&store, &remote, &name, |_, _| {}).await.unwrap();
    assert_eq!((pulled.descriptor.name.as_str(), pulled.descriptor.architecture.as_str()), ("smol", "llama"));
    assert_eq!(pulled.descriptor.primary_file, model_dir(&store, "smol").join("smollm2.Q4_1.gguf"));
    assert!(pulled.extras.is_empty());
    assert_eq!(store.resolve("smol").unwrap().quantization.as_deref(), Some("Q4_1"));

    let again = client.pull(&store, &remote, &name, |_, _| {}).await.unwrap();
    assert!(again.already_present);
    assert_eq!(again.descriptor.name, "smol");
    assert_eq!(hub.requests("/resolve/main/").len(), 1, "a model already in the store is not downloaded again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_with_a_range_request_after_the_connection_drops() {
    const CUT: u64 = 40_000_000;
    let hub = TestHub::start(Config { cut_first_download_at: Some(CUT), ..config(&[(REPO, smollm2_repo())]) });
    let (_tmp, store) = store();
    let pulled = pull(&hub, &store, &format!("{REPO}:Q4_1")).await.unwrap();
    assert_eq!(pulled.descriptor.size_bytes, SIZE);
    let tries = hub.requests(&format!("/resolve/main/{FILE}"));
    assert_eq!(tries.len(), 2, "{tries:?}");
    assert_eq!(tries[0].range, None);
    assert_eq!(tries[1].range.as_deref(), Some(format!("bytes={CUT}-").as_str()));
    // The hub announced the real sha256, so the two halves were checked as one file.
    assert_eq!(store.resolve(REPO).unwrap().architecture, "llama");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_a_partial_file_left_by_an_earlier_pull() {
    const HAVE: usize = 10_000_000;
    let hub = TestHub::start(config(&[(REPO, smollm2_repo())]));
    let (_tmp, store) = store();
    let partial = partial_path_for(&model_dir(&store, REPO), FILE);
    std::fs::create_dir_all(partial.parent().unwrap()).unwrap();
    let mut head = vec![0; HAVE];
    File::open(smollm2()).unwrap().read_exact(&mut head).unwrap();
    std::fs::write(&partial, head).unwrap();
    assert!(store.list().is_empty(), "a partial download is not a model");

    let pulled = pull(&hub, &store, &format!("{REPO}:Q4_1")).await.unwrap();
    assert_eq!(pulled.descriptor.size_bytes, SIZE);
    let tries = hub.requests(&format!("/resolve/main/{FILE}"));
    assert_eq!(tries.len(), 1);
    assert_eq!(tries[0].range.as_deref(), Some(format!("bytes={HAVE}-").as_str()));
    assert!(!partial.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sha256_mismatch_fails_and_leaves_no_file_under_the_final_name() {
    let hub = TestHub::start(Config { etag: Etag::Wrong, ..config(&[(REPO, smollm2_repo())]) });
    let (_tmp, store) = store();
    let err = pull(&hub, &store, &format!("{REPO}:Q4_1")).await.unwrap_err();
    assert!(matches!(err, PullError::Hub(HubError::Sha256Mismatch { .. })), "{err}");
    assert!(err.to_string().contains(smollm2_sha256()), "the message shows the actual hash: {err}");
    let dir = model_dir(&store, REPO);
    assert!(!dir.join(FILE).exists());
    assert!(!partial_path_for(&dir, FILE).exists(), "a corrupt download is not kept for resuming");
    assert!(store.list().is_empty());
    assert!(store.resolve(REPO).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_models_and_files_name_the_endpoint() {
    let mut files = smollm2_repo();
    files.push(("broken-Q5_0.gguf".into(), Body::Missing));
    let hub = TestHub::start(config(&[(REPO, files)]));
    let (_tmp, store) = store();

    let err = pull(&hub, &store, "nobody/nothing:Q4_0").await.unwrap_err();
    assert_eq!(err.to_string(), format!("model 'nobody/nothing' not found at {}", hub.url));

    let err = pull(&hub, &store, &format!("{REPO}/sub/absent.gguf")).await.unwrap_err();
    assert_eq!(err.to_string(), format!("file 'sub/absent.gguf' of model '{REPO}' not found at {}", hub.url));

    // Listed, but the download itself answers 404.
    let err = pull(&hub, &store, &format!("{REPO}:Q5_0")).await.unwrap_err();
    assert_eq!(err.to_string(), format!("file 'broken-Q5_0.gguf' of model '{REPO}' not found at {}", hub.url));
    assert_eq!(entries(store.root()), Vec::<String>::new(), "a failed first pull leaves no directories");

    let err = pull(&hub, &store, &format!("{REPO}:Q6_K")).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("available: SmolLM2-135M-Instruct-Q4_1.gguf, SmolLM2-135M-Instruct-Q8_0.gguf, broken-Q5_0.gguf"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_sent_as_bearer_and_its_absence_is_explained() {
    let hub = TestHub::start(Config { token: Some("hf_secret".into()), ..config(&[(REPO, smollm2_repo())]) });
    let spec = PullSpec::parse(&format!("{REPO}:Q4_1")).unwrap();

    let err = hub.client().locate(&spec).await.unwrap_err();
    assert!(matches!(err, PullError::Hub(HubError::Unauthorized { status: 401, .. })), "{err}");
    assert!(err.to_string().contains("set HF_TOKEN"), "{err}");

    let wrong = Hub::new(&hub.url, Some("hf_wrong".into())).unwrap();
    assert!(wrong.locate(&spec).await.unwrap_err().to_string().contains("the HF_TOKEN sent does not grant access"));

    let right = Hub::new(&hub.url, Some("hf_secret".into())).unwrap();
    assert_eq!(right.locate(&spec).await.unwrap().path, FILE);
    assert_eq!(hub.requests("/api/models/").last().unwrap().authorization.as_deref(), Some("Bearer hf_secret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_names_that_could_escape_are_refused() {
    let files = vec![
        ("../../escape-Q4_1.gguf".to_string(), Body::Bytes(b"GGUF".to_vec())),
        ("/etc/absolute-Q8_0.gguf".to_string(), Body::Bytes(b"GGUF".to_vec())),
    ];
    let hub = TestHub::start(config(&[("testorg/evil", files)]));
    let (_tmp, store) = store();
    for spec in ["testorg/evil:Q4_1", "testorg/evil:Q8_0", "testorg/evil/../../escape-Q4_1.gguf"] {
        let err = pull(&hub, &store, spec).await.unwrap_err();
        assert!(matches!(err, PullError::Hub(HubError::UnsafePath { .. })), "{spec}: {err}");
        assert!(err.to_string().contains("could escape the model directory"), "{err}");
    }
    assert!(hub.requests("resolve").is_empty(), "nothing was downloaded");
    assert_eq!(entries(store.root()), Vec::<String>::new());
    assert!(!Path::new(&store.root().join("escape-Q4_1.gguf")).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locates_and_pulls_through_the_hub_mirror_at_the_listed_commit() {
    const REPO: &str = "testorg/SmolLM2-GGUF";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), br#"{"model_type": "llama"}"#).unwrap();
    link(&smollm2(), &dir.path().join(FILE));
    link(&tiny(), &dir.path().join("small/tiny-Q8_0.gguf"));
    let hub = HubMirror::start(vec![(REPO.into(), dir.path().into())]).await.unwrap();
    let client = Hub::new(&hub.endpoint(), None).unwrap();
    let spec = PullSpec::parse(&format!("{REPO}:Q8_0")).unwrap();
    let remote = client.locate(&spec).await.unwrap();
    assert_eq!(remote.path, "small/tiny-Q8_0.gguf");

    let store_dir = tempfile::tempdir().unwrap();
    let store = ModelStore::open(store_dir.path()).unwrap();
    let name = ModelName::parse("tiny").unwrap();
    let pulled = client.pull(&store, &remote, &name, |_, _| {}).await.unwrap();
    assert!(!pulled.already_present);
    assert_eq!(pulled.descriptor.architecture, "llama");
    assert_eq!(pulled.extras, ["config.json"]);
    let stored = store.model_dir(&name).join("tiny-Q8_0.gguf");
    assert_eq!(std::fs::read(stored).unwrap(), std::fs::read(tiny()).unwrap());
    let commit = &remote.listing.revision;
    assert_eq!(commit.len(), 40, "the listing's commit: {commit}");
    let log = hub.request_log();
    let file = format!("/{REPO}/resolve/{commit}/small/tiny-Q8_0.gguf");
    assert!(log.iter().any(|r| r.path == file), "downloaded at the listed commit: {log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speech_models_are_pulled_with_what_they_need_beside_them() {
    use llmr_hub_mirror::real_model;
    use llmr_model_store::Format;
    let voices = tempfile::tempdir().unwrap();
    let voice = "en/en_US/joe/medium/en_US-joe-medium.onnx";
    link(&real_model("piper-joe", "piper-joe/en_US-joe-medium.onnx"), &voices.path().join(voice));
    link(
        &real_model("piper-joe", "piper-joe/en_US-joe-medium.onnx.json"),
        &voices.path().join(format!("{voice}.json")),
    );
    std::fs::write(voices.path().join("lonely.onnx"), b"no config").unwrap();
    let whisper = tempfile::tempdir().unwrap();
    link(&real_model("whisper-tiny.en", "whisper/ggml-tiny.en.bin"), &whisper.path().join("ggml-tiny.en.bin"));
    std::fs::write(whisper.path().join("config.json"), b"{}").unwrap();
    let hub = HubMirror::start(vec![
        ("rhasspy/piper-voices".into(), voices.path().into()),
        ("ggerganov/whisper.cpp".into(), whisper.path().into()),
    ])
    .await
    .unwrap();
    let client = Hub::new(&hub.endpoint(), None).unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    let store = ModelStore::open(store_dir.path()).unwrap();

    let remote = client.locate(&PullSpec::parse(&format!("rhasspy/piper-voices/{voice}")).unwrap()).await.unwrap();
    let pulled = client.pull(&store, &remote, &ModelName::parse("joe").unwrap(), |_, _| {}).await.unwrap();
    assert_eq!((pulled.descriptor.format, pulled.descriptor.architecture.as_str()), (Format::Onnx, "piper"));
    assert_eq!(
        entries(&store.model_dir(&ModelName::parse("joe").unwrap())),
        ["en_US-joe-medium.onnx", "en_US-joe-medium.onnx.json"]
    );
    // A voice whose config the repository lacks cannot be served, so it is not pulled.
    let lonely = PullSpec::parse("rhasspy/piper-voices/lonely.onnx").unwrap();
    assert!(matches!(client.locate(&lonely).await, Err(PullError::Hub(HubError::FileNotFound { .. }))));

    let remote = client.locate(&PullSpec::parse("ggerganov/whisper.cpp/ggml-tiny.en.bin").unwrap()).await.unwrap();
    let name = ModelName::parse("whisper-1").unwrap();
    let pulled = client.pull(&store, &remote, &name, |_, _| {}).await.unwrap();
    assert_eq!((pulled.descriptor.format, pulled.descriptor.architecture.as_str()), (Format::Ggml, "whisper"));
    assert!(pulled.extras.is_empty(), "a speech model takes no LLM configs: {:?}", pulled.extras);
    assert_eq!(store.resolve("whisper-1").unwrap().size_bytes, 77_704_698);
    // Pulled again: already there, nothing downloaded.
    assert!(client.pull(&store, &remote, &name, |_, _| {}).await.unwrap().already_present);
}
