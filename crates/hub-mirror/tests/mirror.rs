//! The mirror over real files: listings, downloads with ranges, errors. (Our own hub client
//! pulling through it is tested in `llmr-hub`.)

use llmr_hub_mirror::{link, real_model, recorded_sha256, HubMirror, LFS_THRESHOLD};
use reqwest::blocking::Client;
use reqwest::StatusCode;
use serde_json::Value;
use std::io::{Read, Write};

const REPO: &str = "testorg/SmolLM2-GGUF";
const BIG: &str = "SmolLM2-135M-Instruct-Q4_1.gguf";

/// A repository with a small JSON file, a nested small GGUF and the 98 MB SmolLM2 (LFS).
fn repo_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), br#"{"model_type": "llama"}"#).unwrap();
    link(&real_model("smollm2", "smollm2-135m-instruct-q4_1.gguf"), &dir.path().join(BIG));
    link(&real_model("tiny", "tiny-random-llama.gguf"), &dir.path().join("small/tiny-Q8_0.gguf"));
    dir
}

fn get(client: &Client, url: &str, range: Option<&str>) -> reqwest::blocking::Response {
    let mut request = client.get(url);
    if let Some(range) = range {
        request = request.header("range", range);
    }
    request.send().unwrap()
}

#[test]
fn lists_files_with_sizes_and_lfs_hashes() {
    let dir = repo_dir();
    let hub = HubMirror::start_blocking(vec![(REPO.into(), dir.path().into())]).unwrap();
    let client = Client::new();

    let plain: Value = get(&client, &format!("{}/api/models/{REPO}", hub.endpoint()), None).json().unwrap();
    assert_eq!(plain["id"], REPO);
    let sha = plain["sha"].as_str().unwrap().to_string();
    assert_eq!(sha.len(), 40);
    let names: Vec<&str> =
        plain["siblings"].as_array().unwrap().iter().map(|s| s["rfilename"].as_str().unwrap()).collect();
    assert_eq!(names, [BIG, "config.json", "small/tiny-Q8_0.gguf"]);
    assert!(plain["siblings"][0].get("size").is_none(), "sizes only with blobs=true");

    for rev in ["main", sha.as_str()] {
        let url = format!("{}/api/models/{REPO}/revision/{rev}?blobs=true", hub.endpoint());
        let listed: Value = get(&client, &url, None).json().unwrap();
        assert_eq!(listed["sha"], sha.as_str());
        let big = &listed["siblings"][0];
        let smollm2 = real_model("smollm2", "smollm2-135m-instruct-q4_1.gguf");
        assert_eq!(big["size"], 98_362_432);
        assert_eq!(big["lfs"]["sha256"], recorded_sha256(&smollm2).as_str());
        assert_eq!(big["lfs"]["size"], 98_362_432);
        let small = &listed["siblings"][1];
        assert_eq!(small["size"], 23);
        assert!(small.get("lfs").is_none(), "files up to {LFS_THRESHOLD} bytes are not in LFS");
    }

    let response = get(&client, &format!("{}/api/models/{REPO}/revision/v9", hub.endpoint()), None);
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(response.headers()["x-error-code"], "RevisionNotFound");
    let response = get(&client, &format!("{}/api/models/nobody/nothing", hub.endpoint()), None);
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(response.json::<Value>().unwrap(), serde_json::json!({"error": "Repository not found"}));
    assert_eq!(hub.requests()[0], format!("/api/models/{REPO}"));
}

#[test]
fn downloads_whole_files_and_ranges_with_hugging_face_headers() {
    let dir = repo_dir();
    let hub = HubMirror::start_blocking(vec![(REPO.into(), dir.path().into())]).unwrap();
    let client = Client::new();
    let smollm2 = real_model("smollm2", "smollm2-135m-instruct-q4_1.gguf");
    let sha = recorded_sha256(&smollm2);
    let url = format!("{}/{REPO}/resolve/main/{BIG}", hub.endpoint());

    let head = client.head(&url).send().unwrap();
    assert_eq!(head.status(), StatusCode::OK);
    assert_eq!(head.headers()["content-length"], "98362432");
    assert_eq!(head.headers()["accept-ranges"], "bytes");
    assert_eq!(head.headers()["x-linked-size"], "98362432");
    assert_eq!(head.headers()["x-linked-etag"].to_str().unwrap(), format!("\"{sha}\""));
    assert_eq!(head.headers()["etag"].to_str().unwrap(), format!("\"{sha}\""));

    let mut expected = vec![0u8; 64];
    std::fs::File::open(&smollm2).unwrap().read_exact(&mut expected).unwrap();
    let part = get(&client, &url, Some("bytes=0-63"));
    assert_eq!(part.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(part.headers()["content-range"], "bytes 0-63/98362432");
    assert_eq!(part.bytes().unwrap().as_ref(), expected.as_slice());

    let tail = get(&client, &url, Some("bytes=98362430-"));
    assert_eq!(tail.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(tail.headers()["content-range"], "bytes 98362430-98362431/98362432");
    assert_eq!(tail.bytes().unwrap().len(), 2);
    assert_eq!(get(&client, &url, Some("bytes=98362432-")).status(), StatusCode::RANGE_NOT_SATISFIABLE);

    let whole = get(&client, &url, None);
    assert_eq!(whole.status(), StatusCode::OK);
    assert_eq!(whole.content_length(), Some(98_362_432));
    assert_eq!(whole.bytes().unwrap().len(), 98_362_432);

    let small = get(&client, &format!("{}/{REPO}/resolve/main/config.json", hub.endpoint()), None);
    assert!(small.headers().get("x-linked-etag").is_none());
    let etag = small.headers()["etag"].to_str().unwrap().to_string();
    assert_eq!(etag.len(), 42, "a quoted git blob id: {etag}");
    assert_eq!(small.text().unwrap(), r#"{"model_type": "llama"}"#);

    let nested = get(&client, &format!("{}/{REPO}/resolve/main/small/tiny-Q8_0.gguf", hub.endpoint()), None);
    assert_eq!(
        nested.bytes().unwrap().len() as u64,
        std::fs::metadata(real_model("tiny", "tiny-random-llama.gguf")).unwrap().len()
    );

    let missing = get(&client, &format!("{}/{REPO}/resolve/main/absent.json", hub.endpoint()), None);
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert_eq!(missing.headers()["x-error-code"], "EntryNotFound");
    assert_eq!(missing.json::<Value>().unwrap(), serde_json::json!({"error": "Entry not found"}));
    let missing = get(&client, &format!("{}/nobody/nothing/resolve/main/config.json", hub.endpoint()), None);
    assert_eq!(missing.json::<Value>().unwrap(), serde_json::json!({"error": "Repository not found"}));
}

/// Sends a request line as is (HTTP clients resolve `..` before sending).
fn raw_status(endpoint: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(endpoint.trim_start_matches("http://")).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer.lines().next().unwrap_or_default().to_string()
}

#[test]
fn paths_that_escape_the_repository_are_refused() {
    let outer = tempfile::tempdir().unwrap();
    std::fs::write(outer.path().join("secret.txt"), b"secret").unwrap();
    let dir = outer.path().join("repo");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), b"{}").unwrap();
    let hub = HubMirror::start_blocking(vec![("o/n".into(), dir)]).unwrap();
    for path in [
        "/o/n/resolve/main/../secret.txt",
        "/o/n/resolve/main/a/../../secret.txt",
        "/o/n/resolve/main/a%2F..%2F..%2Fsecret.txt",
    ] {
        let status = raw_status(&hub.endpoint(), path);
        assert!(status.contains(" 400 "), "{path}: {status}");
    }
    assert!(raw_status(&hub.endpoint(), "/o/n/resolve/main/config.json").contains(" 200 "));
    assert!(HubMirror::start_blocking(vec![("../x".into(), outer.path().into())]).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_on_the_callers_runtime() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), b"# hi").unwrap();
    let hub = HubMirror::start(vec![("o/n".into(), dir.path().into())]).await.unwrap();
    let endpoint = hub.endpoint();
    let body = tokio::task::spawn_blocking(move || {
        Client::new().get(format!("{endpoint}/o/n/resolve/main/README.md")).send().unwrap().text().unwrap()
    })
    .await
    .unwrap();
    assert_eq!(body, "# hi");
    assert_eq!(hub.requests(), ["/o/n/resolve/main/README.md"]);
}
