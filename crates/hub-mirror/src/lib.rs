//! A Hugging Face compatible hub served on 127.0.0.1 from local directories, for tests.
//!
//! Each repository (`owner/name`) is a directory whose files, recursively and following symbolic
//! links, are the repository's files; a test can link a large model file from the model cache
//! instead of copying it. The mirror answers as huggingface.co does:
//!
//! - `GET /api/models/{owner}/{name}[/revision/{rev}][?blobs=true]`: `id`, `sha` and `siblings`
//!   (`rfilename`; with `blobs=true` also `size`, `blobId` and, for files over
//!   [`LFS_THRESHOLD`], `lfs: {sha256, size}`).
//! - `GET|HEAD /{owner}/{name}/resolve/{rev}/{path}`: the file, streamed, with `Content-Length`,
//!   `Accept-Ranges: bytes`, single `Range` requests (206 + `Content-Range`, 416), an `ETag`
//!   (the sha256 for LFS files, the git blob id otherwise) and, for LFS files, `X-Linked-Etag`
//!   and `X-Linked-Size`.
//! - 404 `{"error":"Repository not found"}` / `{"error":"Entry not found"}` (with Hugging Face's
//!   `X-Error-Code`), 404 for a revision other than `main` or the repository's `sha`, 400 for a
//!   path with `..`.
//!
//! Every file is hashed once, when the mirror starts (in a blocking task), and the digests are
//! kept for the process, so several mirrors over the same model file hash it once.
//!
//! [`real_model`] finds the real files tests serve, in the cache `scripts/fetch-models` fills.
#![forbid(unsafe_code)]

mod models;
mod repo;
mod routes;

pub use models::{link, model_cache, real_model, recorded_sha256};
pub use repo::LFS_THRESHOLD;

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// One request the mirror received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedRequest {
    pub method: String,
    /// As sent (percent-encoded), without the query.
    pub path: String,
    pub query: Option<String>,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

/// A running mirror; dropping it stops the server.
pub struct HubMirror {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<LoggedRequest>>>,
    shutdown: Option<oneshot::Sender<()>>,
    /// The thread owning the runtime of [`HubMirror::start_blocking`].
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HubMirror {
    /// Serves `repos`: repository id (`owner/name`) -> directory whose files (recursively) are
    /// the repository's files. Returns once every file is hashed and the port is bound. The
    /// server runs on the current Tokio runtime until the mirror is dropped.
    pub async fn start(repos: Vec<(String, PathBuf)>) -> io::Result<HubMirror> {
        for (id, _) in &repos {
            repo::check_repo_id(id)?;
        }
        let scanned = tokio::task::spawn_blocking(move || {
            repos.into_iter().map(|(id, dir)| repo::scan(&dir).map(|r| (id, r))).collect::<io::Result<BTreeMap<_, _>>>()
        })
        .await
        .map_err(io::Error::other)??;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let app = routes::router(Arc::new(routes::Hub { repos: scanned, log: log.clone() }));
        let (shutdown, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            if let Err(error) = serve.await {
                tracing::warn!(%error, "hub mirror stopped");
            }
        });
        Ok(HubMirror { addr, log, shutdown: Some(shutdown), thread: None })
    }

    /// [`HubMirror::start`] for synchronous tests: the server runs on its own thread and
    /// runtime, which end when the mirror is dropped. May be called inside a runtime too.
    pub fn start_blocking(repos: Vec<(String, PathBuf)>) -> io::Result<HubMirror> {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (shutdown, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("hub-mirror".into()).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
                match HubMirror::start(repos).await {
                    Ok(mirror) => {
                        let _ = started_tx.send(Ok((mirror.addr, mirror.log.clone())));
                        let _ = stopped.await;
                        drop(mirror);
                    }
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                    }
                }
            });
            // Open connections die with the runtime instead of being waited for.
            runtime.shutdown_background();
        })?;
        let (addr, log) = started_rx.recv().map_err(|_| io::Error::other("the hub mirror thread died"))??;
        Ok(HubMirror { addr, log, shutdown: Some(shutdown), thread: Some(thread) })
    }

    /// `http://127.0.0.1:PORT`, to use as `HF_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The paths requested so far, in order (percent-encoded as sent, without the query).
    pub fn requests(&self) -> Vec<String> {
        self.request_log().into_iter().map(|r| r.path).collect()
    }

    /// Every request so far, with its method, query, `Range` and `Authorization` headers.
    pub fn request_log(&self) -> Vec<LoggedRequest> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for HubMirror {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
