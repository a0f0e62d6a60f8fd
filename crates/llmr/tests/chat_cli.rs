//! `llmr chat`, run as the real binary with stdin from a pipe, against an OpenAI-shaped server
//! on 127.0.0.1 that the test serves itself (std TcpListener, SSE streamed in several writes).

use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Debug)]
struct Request {
    method: String,
    path: String,
    authorization: Option<String>,
    body: Value,
}

/// Answers `GET /v1/models` with one model, and `POST /v1/chat/completions` with the streamed
/// text `Hello, turn N.` (N counts completions), or an OpenAI error when the last message
/// contains "fail".
struct FakeServer {
    url: String,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl FakeServer {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        // Ends with the test process; it only answers connections the test makes.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = handle(stream, &log);
            }
        });
        Self { url, requests }
    }

    fn chats(&self) -> Vec<Request> {
        self.requests.lock().unwrap().iter().filter(|r| r.path == "/v1/chat/completions").cloned().collect()
    }
}

fn handle(mut stream: TcpStream, log: &Mutex<Vec<Request>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
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
    let len: usize = headers.get("content-length").map_or(0, |l| l.parse().unwrap());
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let request = Request { method, path, authorization: headers.get("authorization").cloned(), body };
    let turn = {
        let mut log = log.lock().unwrap();
        log.push(request.clone());
        log.iter().filter(|r| r.path == "/v1/chat/completions").count()
    };

    let json_response = |stream: &mut TcpStream, status: &str, body: Value| {
        let body = body.to_string();
        write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/v1/models") => json_response(
            &mut stream,
            "200 OK",
            json!({ "object": "list", "data": [{ "id": "smollm2", "object": "model" }, { "id": "other" }] }),
        ),
        ("POST", "/v1/chat/completions") => {
            let last = request.body["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
            if last["content"].as_str().is_some_and(|c| c.contains("fail")) {
                let error = json!({ "error": { "message": "boom: the model fell over", "type": "server_error" } });
                return json_response(&mut stream, "500 Internal Server Error", error);
            }
            // No Content-Length: the body ends when the connection closes, as in a streamed reply.
            write!(stream, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")?;
            let mut events = vec![json!({ "choices": [{ "index": 0, "delta": { "role": "assistant" } }] })];
            for piece in ["Hello", ", turn ", &turn.to_string(), "."] {
                events.push(json!({ "choices": [{ "index": 0, "delta": { "content": piece } }] }));
            }
            events.push(json!({ "choices": [{ "index": 0, "delta": {}, "finish_reason": "stop" }] }));
            for event in events {
                write!(stream, "data: {event}\n\n")?;
                stream.flush()?;
                std::thread::sleep(Duration::from_millis(5));
            }
            write!(stream, "data: [DONE]\n\n")
        }
        _ => json_response(&mut stream, "404 Not Found", json!({ "error": { "message": "no route" } })),
    }
}

/// Runs `llmr chat ARGS` with `input` on stdin; (success, stdout, stderr).
fn chat(args: &[&str], input: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_llmr"))
        .arg("chat")
        .args(args)
        .env_remove("LLMR_URL")
        .env_remove("LLMR_API_KEY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

fn roles_and_contents(request: &Request) -> Vec<(String, String)> {
    request.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_string(), m["content"].as_str().unwrap().to_string()))
        .collect()
}

fn msgs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(r, c)| (r.to_string(), c.to_string())).collect()
}

#[test]
fn streams_answers_keeps_history_and_survives_errors() {
    let server = FakeServer::start();
    let input = "hello\nand then?\n/reset\nplease fail\nafter the reset\n/exit\nnever sent\n";
    let (ok, stdout, stderr) = chat(&["--url", &server.url, "--api-key", "sk-test", "--system", "Be brief."], input);
    assert!(ok, "{stdout}\n{stderr}");
    assert_eq!(stdout, "Hello, turn 1.\nHello, turn 2.\nHello, turn 4.\n", "stderr: {stderr}");
    assert!(stderr.contains("error: boom: the model fell over"), "{stderr}");

    let requests = server.requests.lock().unwrap().clone();
    assert_eq!(requests[0].path, "/v1/models", "the model defaults to the first one listed");
    assert!(requests.iter().all(|r| r.authorization.as_deref() == Some("Bearer sk-test")), "{requests:?}");
    let chats = server.chats();
    assert_eq!(chats.len(), 4, "nothing is sent after /exit");
    for c in &chats {
        assert_eq!((c.body["model"].as_str(), c.body["stream"].as_bool()), (Some("smollm2"), Some(true)));
    }
    let system = ("system", "Be brief.");
    assert_eq!(roles_and_contents(&chats[0]), msgs(&[system, ("user", "hello")]));
    assert_eq!(
        roles_and_contents(&chats[1]),
        msgs(&[system, ("user", "hello"), ("assistant", "Hello, turn 1."), ("user", "and then?")]),
        "the second turn carries the conversation"
    );
    assert_eq!(roles_and_contents(&chats[2]), msgs(&[system, ("user", "please fail")]), "/reset forgets it");
    assert_eq!(
        roles_and_contents(&chats[3]),
        msgs(&[system, ("user", "after the reset")]),
        "a failed turn is not kept"
    );
}

#[test]
fn end_of_input_ends_the_session_and_the_model_can_be_named() {
    let server = FakeServer::start();
    let (ok, stdout, stderr) = chat(&["--url", &format!("{}/v1/", server.url), "--model", "other"], "hi\n\n");
    assert!(ok, "{stdout}\n{stderr}");
    assert_eq!(stdout, "Hello, turn 1.\n");
    let requests = server.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1, "no model listing when --model is given: {requests:?}");
    assert_eq!(requests[0].body["model"], "other");
    assert_eq!(requests[0].authorization, None);
}

#[test]
fn an_unreachable_server_is_reported() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let (ok, _, stderr) = chat(&["--url", &url], "hi\n");
    assert!(!ok);
    assert!(stderr.contains(&format!("cannot reach the server at {url}")), "{stderr}");
}
