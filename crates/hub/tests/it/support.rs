//! Test support: real model files from the cache, and small HTTP servers on loopback that log
//! what they are sent.

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use llmr_hub_mirror::{link, real_model};

pub fn smollm2() -> PathBuf {
    real_model("smollm2", "smollm2-135m-instruct-q4_1.gguf")
}

pub fn tiny() -> PathBuf {
    real_model("tiny", "tiny-random-llama.gguf")
}

/// The names in a folder, sorted.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

/// One request a [`Server`] received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub authorization: Option<String>,
}

/// An axum app served on 127.0.0.1 (a port of its own: an origin of its own) until the test ends.
pub struct Server {
    pub endpoint: String,
    log: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    pub async fn start(app: axum::Router) -> Server {
        let log = Arc::new(Mutex::new(Vec::new()));
        let app = app.layer(middleware::from_fn_with_state(log.clone(), record));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Server { endpoint, log }
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
}

async fn record(State(log): State<Arc<Mutex<Vec<Seen>>>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let path = request.uri().path().to_string();
    let seen = Seen { path, authorization: header("authorization") };
    log.lock().unwrap().push(seen);
    next.run(request).await
}
