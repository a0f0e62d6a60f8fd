//! `llmr node` as a real process against a minimal router on loopback (the `/v0` contract, node
//! side): it registers, prints where it listens, requires its secret on `/v1`, stops cleanly on
//! SIGTERM, and exits with the reason when the router refuses its token.
//!
//! Needs the plugins in `engines/` (`scripts/install-engines`).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn engines() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../engines")
}

/// Answers `/v0` as the router does, for the token `good`; keeps the registrations.
struct Router {
    url: String,
    registrations: Arc<Mutex<Vec<Value>>>,
}

fn respond(stream: &mut TcpStream, status: &str, body: &Value) {
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes()));
}

fn handle(mut stream: TcpStream, registrations: &Mutex<Vec<Value>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (mut length, mut authorized) = (0usize, false);
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
        let (name, value) = header.split_once(':').unwrap_or_default();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().unwrap_or(0),
            "authorization" => authorized = value.trim() == "Bearer good",
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    if !authorized {
        respond(&mut stream, "401 Unauthorized", &json!({"error": {"message": "invalid API key"}}));
    } else if path == "/v0/nodes" {
        registrations.lock().unwrap().push(serde_json::from_slice(&body).unwrap());
        respond(&mut stream, "200 OK", &json!({"node_id": "n1", "heartbeat_interval_ms": 200}));
    } else if path.ends_with("/heartbeat") {
        respond(&mut stream, "200 OK", &json!({"models_version": 1}));
    } else {
        respond(&mut stream, "200 OK", &json!({"object": "list", "data": []}));
    }
    Ok(())
}

impl Router {
    fn start() -> Router {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let registrations = Arc::new(Mutex::new(Vec::new()));
        let kept = registrations.clone();
        // Ends with the test process.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || handle(stream, &kept));
            }
        });
        Router { url, registrations }
    }
}

fn node(router: &Router, token: &str) -> Command {
    assert!(
        engines().join("llama_cpp/cpu/libllmr_llama_cpp.so").is_file(),
        "the llama.cpp plugin is not installed: run scripts/install-engines"
    );
    let home = tempfile::tempdir().unwrap().keep();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_llmr"));
    cmd.args(["node", "--router", &router.url, "--token", token, "--name", "test-node"])
        .arg("--engines-dir")
        .arg(engines())
        .arg("--store")
        .arg(home.join("models"))
        .env("HOME", &home)
        .env_remove("LLMR_API_KEY")
        .stderr(Stdio::piped());
    cmd
}

#[test]
fn registers_prints_its_address_requires_its_secret_and_stops_on_sigterm() {
    let router = Router::start();
    let mut child = node(&router, "good").spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = loop {
        let line = lines.next().expect("llmr node exited before registering").unwrap();
        if line.starts_with("llmr node listening on ") {
            break line;
        }
    };
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let url = line.strip_prefix("llmr node listening on ").unwrap().split(',').next().unwrap().to_string();
    assert!(line.ends_with(&format!("registered with {} as test-node (id n1)", router.url)), "{line}");

    let registration = router.registrations.lock().unwrap()[0].clone();
    assert_eq!(registration["url"], url.as_str());
    assert_eq!(registration["name"], "test-node");
    let secret = registration["secret"].as_str().unwrap().to_string();
    assert_eq!(secret.len(), 64, "32 random bytes, hex");
    assert!(registration["runtimes"].as_array().unwrap().contains(&json!("LlamaCpp")), "{registration}");

    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let models = format!("{url}/v1/models");
    assert_eq!(http.get(&models).send().unwrap().status().as_u16(), 401);
    assert_eq!(http.get(&models).bearer_auth("guess").send().unwrap().status().as_u16(), 401);
    assert_eq!(http.get(&models).bearer_auth(&secret).send().unwrap().status().as_u16(), 200);

    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(drain.join().unwrap().iter().any(|l| l == "llmr: shutting down"));
}

#[test]
fn a_refused_token_ends_the_node_with_the_reason() {
    let router = Router::start();
    let out = node(&router, "bad").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("the router at {} refused the node token (HTTP 401", router.url)), "{err}");
    assert!(router.registrations.lock().unwrap().is_empty());
}
