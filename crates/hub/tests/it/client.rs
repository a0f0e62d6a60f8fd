//! Redirects, the token's scope and ETag trust (axum servers as a hub and its CDN); listings,
//! reads and checked downloads (the hub mirror).

use crate::support::Server;
use axum::http::header::{ETAG, LOCATION};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::get;
use llmr_hub::{sha256_hex, Hub, HubError, Known, Remote, Url};
use llmr_hub_mirror::{HubMirror, LFS_THRESHOLD};
use std::path::Path;

const BODY: &[u8] = b"twenty bytes of body";

fn zeros() -> String {
    "0".repeat(64)
}

/// A CDN serving [`BODY`] at `/blob` with a sha256-shaped ETag that is not [`BODY`]'s.
async fn cdn() -> Server {
    let app = axum::Router::new().route("/blob", get(|| async { ([(ETAG, format!("\"{}\"", zeros()))], BODY) }));
    Server::start(app).await
}

/// A hub whose `o/r/resolve/main/m.bin` redirects to `target` (with Hugging Face's `X-Linked-*`
/// headers when `linked`), and which serves `direct.bin` itself with the CDN's wrong ETag.
async fn hub(target: String, linked: bool) -> Server {
    let redirect = move || {
        let target = target.clone();
        async move {
            let mut headers = HeaderMap::new();
            headers.insert(LOCATION, HeaderValue::from_str(&target).unwrap());
            if linked {
                let etag = format!("\"{}\"", sha256_hex(BODY));
                headers.insert("x-linked-etag", HeaderValue::from_str(&etag).unwrap());
                headers.insert("x-linked-size", HeaderValue::from(BODY.len()));
            }
            (StatusCode::FOUND, headers)
        }
    };
    let app = axum::Router::new()
        .route("/o/r/resolve/main/m.bin", get(redirect))
        .route("/o/r/resolve/main/direct.bin", get(|| async { ([(ETAG, format!("\"{}\"", zeros()))], BODY) }));
    Server::start(app).await
}

async fn download(hub: &Hub, remote: &Remote, dir: &Path, expected: &Known) -> Result<Vec<u8>, HubError> {
    let (partial, dest) = (dir.join("f.partial"), dir.join("f"));
    hub.download(remote, &partial, &dest, expected, |_, _| {}).await?;
    assert!(!partial.exists());
    Ok(std::fs::read(dest).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_goes_to_the_hub_only_never_to_a_server_it_redirects_to() {
    let cdn = cdn().await;
    let hub = hub(format!("{}/blob", cdn.endpoint), true).await;
    let client = Hub::new(&hub.endpoint, Some("hf_secret".into())).unwrap();
    let remote = client.file("o/r", "main", "m.bin");

    let announced = client.head(&remote).await.unwrap();
    assert_eq!(announced, Known { size: Some(BODY.len() as u64), sha256: Some(sha256_hex(BODY)) });
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(download(&client, &remote, dir.path(), &Known::default()).await.unwrap(), BODY);

    let (to_hub, to_cdn) = (hub.requests(), cdn.requests());
    assert_eq!(to_hub.len(), 2, "HEAD and GET: {to_hub:?}");
    assert!(to_hub.iter().all(|r| r.authorization.as_deref() == Some("Bearer hf_secret")), "{to_hub:?}");
    assert!(to_cdn.len() == 2 && to_cdn.iter().all(|r| r.path == "/blob"), "both were redirected: {to_cdn:?}");
    assert!(to_cdn.iter().all(|r| r.authorization.is_none()), "the CDN never sees the token: {to_cdn:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_sha256_etag_is_trusted_from_the_hubs_own_origin_only() {
    let cdn = cdn().await;
    let hub = hub(format!("{}/blob", cdn.endpoint), false).await;
    let client = Hub::new(&hub.endpoint, None).unwrap();
    let dir = tempfile::tempdir().unwrap();

    // Through a redirect without `X-Linked-Etag`: the CDN's ETag says nothing.
    let via_cdn = client.file("o/r", "main", "m.bin");
    assert_eq!(client.head(&via_cdn).await.unwrap(), Known { size: Some(BODY.len() as u64), sha256: None });
    assert_eq!(download(&client, &via_cdn, dir.path(), &Known::default()).await.unwrap(), BODY);

    // The same ETag from the hub itself is taken as the sha256, so the body fails the check.
    let direct = client.file("o/r", "main", "direct.bin");
    assert_eq!(client.head(&direct).await.unwrap().sha256, Some(zeros()));
    std::fs::remove_file(dir.path().join("f")).unwrap();
    let err = download(&client, &direct, dir.path(), &Known::default()).await.unwrap_err();
    assert!(matches!(err, HubError::Sha256Mismatch { .. }), "{err}");
    assert!(!dir.path().join("f").exists() && !dir.path().join("f.partial").exists());

    // A URL on the CDN, asked through a client for the CDN's own origin: its ETags are its own.
    let url = Url::parse(&format!("{}/blob", cdn.endpoint)).unwrap();
    let on_cdn = client.for_url(&url);
    assert_eq!(on_cdn.head(&Remote::url(url)).await.unwrap().sha256, Some(zeros()));
}

/// A repository with a small JSON file and a file over the mirror's LFS threshold.
fn repo_dir() -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), br#"{"model_type": "llama"}"#).unwrap();
    let big: Vec<u8> = (0..LFS_THRESHOLD + 1000).map(|i| (i % 251) as u8).collect();
    std::fs::create_dir_all(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/w.bin"), &big).unwrap();
    (dir, big)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_reads_and_hashes_through_the_mirror() {
    let (dir, big) = repo_dir();
    let mirror = HubMirror::start(vec![("o/m".into(), dir.path().into())]).await.unwrap();
    let hub = Hub::new(&mirror.endpoint(), None).unwrap();

    let listing = hub.list("o/m", "main").await.unwrap();
    assert_eq!(listing.revision.len(), 40, "pinned to the commit: {}", listing.revision);
    assert_eq!(listing.paths(), ["config.json", "sub/w.bin"]);
    let config = listing.get("config.json").unwrap();
    assert_eq!((config.size, config.sha256.as_deref()), (Some(23), None), "not an LFS file");
    let w = listing.get("sub/w.bin").unwrap();
    assert_eq!((w.size, w.sha256.clone()), (Some(big.len() as u64), Some(sha256_hex(&big))));
    let first = mirror.request_log().remove(0);
    assert_eq!((first.path.as_str(), first.query.as_deref()), ("/api/models/o/m/revision/main", Some("blobs=true")));

    let remote = listing.file(&hub, "sub/w.bin");
    assert!(remote.as_url().path().ends_with(&format!("/resolve/{}/sub/w.bin", listing.revision)));
    assert_eq!(hub.read_range(&remote, 5..9).await.unwrap(), &big[5..9]);
    assert_eq!(mirror.request_log().last().unwrap().range.as_deref(), Some("bytes=5-8"));
    let beyond = hub.read_range(&remote, big.len() as u64 - 2..big.len() as u64 + 2).await.unwrap_err();
    assert!(beyond.to_string().contains("received 2"), "{beyond}");
    assert_eq!(hub.hash(&remote).await.unwrap(), (big.len() as u64, sha256_hex(&big)));
    let config = listing.file(&hub, "config.json");
    assert_eq!(hub.read(&config, 1024).await.unwrap(), br#"{"model_type": "llama"}"#);
    let err = hub.read(&config, 10).await.unwrap_err();
    assert!(err.to_string().contains("larger than 10 bytes"), "{err}");

    let err = hub.list("o/m", "v9").await.unwrap_err();
    assert!(matches!(err, HubError::RevisionNotFound { .. }), "{err}");
    let err = hub.list("nobody/nothing", "main").await.unwrap_err();
    assert_eq!(err.to_string(), format!("model 'nobody/nothing' not found at {}", mirror.endpoint()));
    let err = hub.read(&hub.file("o/m", "main", "absent.json"), 10).await.unwrap_err();
    assert_eq!(err.to_string(), format!("file 'absent.json' of model 'o/m' not found at {}", mirror.endpoint()));
    let url = Url::parse(&format!("{}/o/m/resolve/main/absent.json", mirror.endpoint())).unwrap();
    let err = hub.head(&Remote::url(url)).await.unwrap_err();
    assert!(matches!(err, HubError::Http { status: 404, .. }), "a plain URL's status: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_checks_what_the_caller_expects_and_resumes() {
    let (dir, big) = repo_dir();
    let mirror = HubMirror::start(vec![("o/m".into(), dir.path().into())]).await.unwrap();
    let hub = Hub::new(&mirror.endpoint(), None).unwrap();
    let remote = hub.file("o/m", "main", "sub/w.bin");
    let out = tempfile::tempdir().unwrap();
    let (partial, dest) = (out.path().join("w.bin.partial"), out.path().join("w.bin"));
    let (len, sha) = (big.len() as u64, sha256_hex(&big));
    let expect = |size: u64, sha: &str| Known { size: Some(size), sha256: Some(sha.to_string()) };

    let err = hub.download(&remote, &partial, &dest, &expect(len, &zeros()), |_, _| {}).await.unwrap_err();
    assert!(matches!(err, HubError::Sha256Mismatch { .. }), "{err}");
    assert!(err.to_string().contains(&sha), "the message shows the actual hash: {err}");
    assert!(!dest.exists() && !partial.exists(), "a corrupt download is deleted");

    let err = hub.download(&remote, &partial, &dest, &expect(len - 1, &sha), |_, _| {}).await.unwrap_err();
    assert!(matches!(err, HubError::SizeMismatch { .. }), "{err}");
    assert!(!dest.exists() && !partial.exists());

    std::fs::write(&partial, &big[..100_000]).unwrap();
    let mut reports = Vec::new();
    hub.download(&remote, &partial, &dest, &expect(len, &sha.to_uppercase()), |done, total| {
        reports.push((done, total))
    })
    .await
    .unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), big);
    assert!(!partial.exists());
    assert_eq!(mirror.request_log().last().unwrap().range.as_deref(), Some("bytes=100000-"), "resumed");
    assert_eq!(reports.first(), Some(&(100_000, Some(len))));
    assert_eq!(reports.last(), Some(&(len, Some(len))));

    // A complete partial file is answered 416 and checked as it is.
    std::fs::rename(&dest, &partial).unwrap();
    hub.download(&remote, &partial, &dest, &Known::default(), |_, _| {}).await.unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), big);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_path_that_could_escape_fails_the_listing() {
    let app = axum::Router::new().route(
        "/api/models/{owner}/{name}/revision/{rev}",
        get(|| async {
            axum::Json(serde_json::json!({
                "siblings": [{"rfilename": "m-Q4_0.gguf"}, {"rfilename": "../../etc/passwd"}]
            }))
        }),
    );
    let server = Server::start(app).await;
    let err = Hub::new(&server.endpoint, None).unwrap().list("evil/repo", "main").await.unwrap_err();
    assert!(matches!(err, HubError::UnsafePath { .. }), "{err}");
    assert!(err.to_string().contains("\"../../etc/passwd\" from 'evil/repo': it could escape"), "{err}");
}
