//! What the router adds: latency of a request through `llmr router` against the same request sent
//! straight to the node, and the requests/s each path sustains. The router and one node run as
//! child processes of this program; the node answers from its temperature-0 answer cache, so what
//! is measured is HTTP and proxy work, not the engine. See bench/README.md ("Router").
#![forbid(unsafe_code)]

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The one request every measurement sends: after one warm-up, the node replays it from memory.
const BODY: &str = r#"{"model":"smol","messages":[{"role":"user","content":"Say hi"}],"max_tokens":4,"temperature":0}"#;
const MODEL: &str = "smol";
/// The key the node accepts from clients that reach it directly.
const NODE_KEY: &str = "BENCHKEY";

#[derive(Parser)]
struct Args {
    /// The llmr binary (default: release build under CARGO_TARGET_DIR, else ./target/release).
    #[arg(long)]
    llmr: Option<PathBuf>,
    /// The GGUF the node serves as `smol`.
    #[arg(long, default_value_os_t = home().join(".cache/llmr/models/smollm2-135m-instruct-q4_1.gguf"))]
    model_file: PathBuf,
    #[arg(long, default_value_os_t = repo().join("engines"))]
    engines_dir: PathBuf,
    /// Timed requests per side (direct and via the router), interleaved one by one.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Concurrencies of the throughput test (closed loop, one request at a time per client).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    concurrency: Vec<usize>,
    /// Measured seconds per concurrency and side (after a warm-up of a tenth of it).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Worker threads of the load generator (1: one thread, as light as it gets).
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// About 50 requests and 1 s per concurrency: checks the harness, not speed.
    #[arg(long, conflicts_with = "write")]
    smoke: bool,
    /// Extra environment of the router, `KEY=VALUE` (experiments, e.g. TOKIO_WORKER_THREADS=1).
    #[arg(long)]
    router_env: Vec<String>,
    /// Extra environment of the node, `KEY=VALUE`.
    #[arg(long)]
    node_env: Vec<String>,
    /// Append the results to bench/RESULTS.md.
    #[arg(long)]
    write: bool,
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn default_llmr() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir).join("release/llmr"),
        None => repo().join("target/release/llmr"),
    }
}

// ---- child processes ----

/// A child process, its URL and what it wrote to stderr.
struct Proc {
    name: &'static str,
    child: Child,
    url: String,
    log: Arc<Mutex<Vec<String>>>,
}

/// The router and the node; killed (and reaped) when dropped, whatever the exit path.
struct Cluster {
    procs: Vec<Proc>,
    dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().rev() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

impl Cluster {
    fn router(&self) -> &Proc {
        &self.procs[0]
    }

    fn node(&self) -> &Proc {
        &self.procs[1]
    }

    /// The last lines each child wrote, for error messages.
    fn logs(&self) -> String {
        let mut out = String::new();
        for p in &self.procs {
            let log = p.log.lock().unwrap_or_else(|e| e.into_inner());
            let tail = &log[log.len().saturating_sub(20)..];
            out.push_str(&format!("\n--- {} (last {} lines) ---\n{}", p.name, tail.len(), tail.join("\n")));
        }
        out
    }

    /// Spawns `cmd` and waits for its line that starts with `marker`
    /// (`llmr ... listening on http://ADDR...`), which gives its URL.
    fn spawn(&mut self, name: &'static str, mut cmd: Command, marker: &str) -> Result<()> {
        cmd.env("HOME", self.dir.path()).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("starting llmr {name}"))?;
        let stderr = child.stderr.take().context("no stderr")?;
        let log = Arc::new(Mutex::new(Vec::new()));
        self.procs.push(Proc { name, child, url: String::new(), log: log.clone() });
        let (tx, rx) = mpsc::channel();
        let marker = marker.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.starts_with(&marker) {
                    let _ = tx.send(line.split_whitespace().nth(4).unwrap_or("").trim_end_matches(',').to_string());
                }
                log.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => {
                self.procs.last_mut().expect("just pushed").url = url;
                Ok(())
            }
            Err(_) => bail!("llmr {name} did not start{}", self.logs()),
        }
    }
}

/// `llmr` without the settings this shell may hold (`LLMR_*`, `RUST_LOG`, tokio's).
fn llmr_command(llmr: &Path) -> Command {
    let mut cmd = Command::new(llmr);
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k.starts_with("LLMR_") || k.starts_with("TOKIO_") || k == "RUST_LOG" {
            cmd.env_remove(&key);
        }
    }
    cmd
}

fn env_pairs(given: &[String]) -> Result<Vec<(&str, &str)>> {
    given.iter().map(|kv| kv.split_once('=').with_context(|| format!("`{kv}` is not KEY=VALUE"))).collect()
}

fn start_cluster(llmr: &Path, args: &Args) -> Result<Cluster> {
    let mut cluster = Cluster { procs: Vec::new(), dir: tempfile::tempdir()? };
    let store = cluster.dir.path().join("store");
    std::fs::create_dir_all(store.join(MODEL))?;
    let model = std::fs::canonicalize(&args.model_file)
        .with_context(|| format!("{} (scripts/fetch-models smollm2)", args.model_file.display()))?;
    std::os::unix::fs::symlink(model, store.join(MODEL).join("model.gguf"))?;
    let engines = std::fs::canonicalize(&args.engines_dir).context("the engines folder")?;

    let mut router = llmr_command(llmr);
    router
        .args(["router", "--host", "127.0.0.1", "--port", "0", "--no-auth", "--allow-cpu-nodes"])
        .args(["--heartbeat-interval-ms", "500", "--heartbeat-timeout-ms", "3000", "--db"])
        .arg(cluster.dir.path().join("router.db"))
        .envs(env_pairs(&args.router_env)?);
    cluster.spawn("router", router, "llmr router listening on ")?;

    let mut node = llmr_command(llmr);
    node.args(["node", "--router", &cluster.router().url, "--token", "anything", "--name", "bench", "--port", "0"])
        .args(["--threads", "1", "--slots", "4", "--api-key", NODE_KEY, "--store"])
        .arg(&store)
        .arg("--engines-dir")
        .arg(engines)
        .envs(env_pairs(&args.node_env)?);
    cluster.spawn("node", node, "llmr node listening on ")?;
    Ok(cluster)
}

// ---- the two sides ----

/// One way to the model, with its own keep-alive connections.
struct Target {
    url: String,
    key: Option<&'static str>,
    client: reqwest::Client,
    sent: AtomicU64,
}

impl Target {
    fn new(base: &str, key: Option<&'static str>) -> Result<Arc<Target>> {
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(30))
            .pool_idle_timeout(Duration::from_secs(120))
            .build()?;
        Ok(Arc::new(Target { url: format!("{base}/v1/chat/completions"), key, client, sent: AtomicU64::new(0) }))
    }

    /// One request, its body read whole; `Err` for anything but 200.
    async fn call(&self) -> Result<()> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        let mut req = self.client.post(&self.url).header("content-type", "application/json").body(BODY);
        if let Some(key) = self.key {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        if status != reqwest::StatusCode::OK || body.is_empty() {
            bail!("HTTP {status}: {}", String::from_utf8_lossy(&body[..body.len().min(300)]));
        }
        Ok(())
    }
}

/// CPU time (ns) a process has used so far, all its threads together.
fn cpu_ns(pid: Option<u32>) -> u64 {
    let dir = match pid {
        Some(pid) => format!("/proc/{pid}/task"),
        None => "/proc/self/task".to_string(),
    };
    let Ok(tasks) = std::fs::read_dir(dir) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// CPU time (ns) all processes have used so far, from `/proc/stat` (in USER_HZ ticks, 100/s).
fn machine_busy_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> =
        stat.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let busy: u64 = ticks.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, t)| t).sum();
    busy * 10_000_000
}

static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// CPU time used by each process (ns); after `since`, over an interval of `wall` ns.
#[derive(Clone, Copy, Default)]
struct Cpu {
    router: u64,
    node: u64,
    client: u64,
    machine: u64,
    wall: u64,
}

impl Cpu {
    fn now(c: &Cluster) -> Cpu {
        Cpu {
            router: cpu_ns(Some(c.router().child.id())),
            node: cpu_ns(Some(c.node().child.id())),
            client: cpu_ns(None),
            machine: machine_busy_ns(),
            wall: EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64,
        }
    }

    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            router: self.router.saturating_sub(before.router),
            node: self.node.saturating_sub(before.node),
            client: self.client.saturating_sub(before.client),
            machine: self.machine.saturating_sub(before.machine),
            wall: self.wall.saturating_sub(before.wall),
        }
    }

    /// Cores that processes other than these three used over the interval.
    fn others(&self) -> f64 {
        self.machine.saturating_sub(self.router + self.node + self.client) as f64 / self.wall.max(1) as f64
    }
}

async fn wait_until_routable(cluster: &Cluster, router: &Target) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let models = format!("{}/v1/models", cluster.router().url);
    loop {
        let listed = match router.client.get(&models).send().await {
            Ok(r) => r.json::<serde_json::Value>().await.ok(),
            Err(_) => None,
        };
        let ids = listed.as_ref().and_then(|v| v["data"].as_array()).cloned().unwrap_or_default();
        if ids.iter().any(|m| m["id"] == MODEL) {
            // Listed is not yet ready: the first answer loads the model.
            match router.call().await {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => bail!("no answer through the router: {e}"),
                Err(_) => {}
            }
        } else if Instant::now() > deadline {
            bail!("the router never listed `{MODEL}`");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `llmr_generation_cache_hits_total` of the node.
async fn cache_hits(cluster: &Cluster, client: &reqwest::Client) -> Result<u64> {
    let text = client.get(format!("{}/metrics", cluster.node().url)).send().await?.text().await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("llmr_generation_cache_hits_total") && l.contains(&format!("model=\"{MODEL}\"")))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

// ---- measurements ----

struct Latency {
    direct: Vec<u64>,
    router: Vec<u64>,
    /// router - direct of the same pair (ns, signed).
    paired: Vec<i64>,
    cpu: Cpu,
}

async fn latency(direct: &Target, router: &Target, pairs: usize, warmup: usize, cluster: &Cluster) -> Result<Latency> {
    let mut out = Latency { direct: vec![], router: vec![], paired: vec![], cpu: Cpu::default() };
    let mut before = Cpu::now(cluster);
    for i in 0..warmup + pairs {
        if i == warmup {
            before = Cpu::now(cluster);
        }
        // Which side goes first alternates, so neither always follows the other's wake-ups.
        let (mut d, mut r) = (0, 0);
        for router_turn in [i % 2 == 1, i % 2 == 0] {
            let (target, slot) = if router_turn { (router, &mut r) } else { (direct, &mut d) };
            let t = Instant::now();
            target.call().await.with_context(|| format!("latency request {i} ({})", side(router_turn)))?;
            *slot = t.elapsed().as_nanos() as u64;
        }
        if i >= warmup {
            out.direct.push(d);
            out.router.push(r);
            out.paired.push(r as i64 - d as i64);
        }
    }
    out.cpu = Cpu::now(cluster).since(before);
    Ok(out)
}

fn side(router: bool) -> &'static str {
    if router {
        "via router"
    } else {
        "direct"
    }
}

struct Rate {
    ok: u64,
    secs: f64,
    cpu: Cpu,
}

impl Rate {
    fn per_sec(&self) -> f64 {
        self.ok as f64 / self.secs
    }

    /// The CPU columns: router / node / load generator, per answered request.
    fn cpu_per_request(&self) -> String {
        let per = |ns: u64| us(ns as f64 / self.ok.max(1) as f64);
        format!("{} / {} / {}", per(self.cpu.router), per(self.cpu.node), per(self.cpu.client))
    }
}

/// `clients` closed-loop clients for `warm + measure`; counts the answers that end inside the
/// measured window. Any failed request fails the run.
async fn throughput(
    target: &Arc<Target>,
    clients: usize,
    warm: Duration,
    measure: Duration,
    cluster: &Cluster,
) -> Result<Rate> {
    let start = Instant::now() + warm;
    let end = start + measure;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let target = target.clone();
            tokio::spawn(async move {
                let (mut ok, mut failed, mut first_error) = (0u64, 0u64, None);
                while Instant::now() < end {
                    let result = target.call().await;
                    let done = Instant::now();
                    match result {
                        Err(e) => {
                            failed += 1;
                            first_error.get_or_insert(e);
                        }
                        Ok(()) if done >= start && done <= end => ok += 1,
                        Ok(()) => {}
                    }
                }
                (ok, failed, first_error)
            })
        })
        .collect();
    tokio::time::sleep_until(start.into()).await;
    let before = Cpu::now(cluster);
    tokio::time::sleep_until(end.into()).await;
    let cpu = Cpu::now(cluster).since(before);
    let (mut ok, mut failed, mut first_error) = (0, 0, None);
    for task in tasks {
        let (o, f, e) = task.await?;
        ok += o;
        failed += f;
        first_error = first_error.or(e);
    }
    if let Some(e) = first_error {
        bail!("{failed} requests failed (first: {e:#})");
    }
    Ok(Rate { ok, secs: measure.as_secs_f64(), cpu })
}

// ---- report ----

fn percentile(sorted: &[u64], q: f64) -> u64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn us(ns: f64) -> String {
    let v = ns / 1e3;
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn signed_us(ns: f64) -> String {
    if ns >= 0.0 {
        format!("+{}", us(ns))
    } else {
        us(ns)
    }
}

struct Measured {
    latency: Latency,
    /// (concurrency, direct, router)
    rates: Vec<(usize, Rate, Rate)>,
    node_requests: u64,
    node_cache_hits: u64,
}

fn tables(m: &Measured) -> String {
    let (mut d, mut r) = (m.latency.direct.clone(), m.latency.router.clone());
    d.sort_unstable();
    r.sort_unstable();
    let mut paired = m.latency.paired.clone();
    paired.sort_unstable();
    let n = d.len();
    let mut s = String::from(
        "| figure | direct to node | via router | router − direct | router / direct |\n|---|---:|---:|---:|---:|\n",
    );
    for (label, q) in [("p50", 0.50), ("p95", 0.95), ("p99", 0.99)] {
        let (a, b) = (percentile(&d, q) as f64, percentile(&r, q) as f64);
        s += &format!("| latency {label} (µs) | {} | {} | {} | {:.2} |\n", us(a), us(b), signed_us(b - a), b / a);
    }
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len() as f64;
    let (a, b) = (mean(&d), mean(&r));
    s += &format!("| latency mean (µs) | {} | {} | {} | {:.2} |\n", us(a), us(b), signed_us(b - a), b / a);
    s += &format!("| paired difference, median (µs) | | | {} | |\n", signed_us(paired[paired.len() / 2] as f64));
    let cpu = &m.latency.cpu;
    let per = |ns: u64, reqs: usize| ns as f64 / reqs as f64;
    s += &format!(
        "| info: CPU per request pair, router / node / load generator (µs) | | | {} / {} / {} | |\n",
        us(per(cpu.router, n)),
        us(per(cpu.node, n)),
        us(per(cpu.client, n))
    );
    s += &format!("| info: latency: other processes' CPU (cores) | | | {:.2} | |\n", cpu.others());
    for (c, direct, router) in &m.rates {
        s += &format!(
            "| c={c}: requests/s | {:.0} | {:.0} | {:+.0} | {:.2} |\n",
            direct.per_sec(),
            router.per_sec(),
            router.per_sec() - direct.per_sec(),
            router.per_sec() / direct.per_sec()
        );
        s += &format!(
            "| info: c={c}: CPU per request, router / node / load generator (µs) | {} | {} | | |\n",
            direct.cpu_per_request(),
            router.cpu_per_request()
        );
        s += &format!(
            "| info: c={c}: other processes' CPU (cores) | {:.2} | {:.2} | | |\n",
            direct.cpu.others(),
            router.cpu.others()
        );
    }
    let best = m.rates.iter().map(|(_, _, r)| r.per_sec()).fold(0.0, f64::max);
    let (p50, p99) = (
        percentile(&r, 0.5) as f64 - percentile(&d, 0.5) as f64,
        percentile(&r, 0.99) as f64 - percentile(&d, 0.99) as f64,
    );
    let met = |ok: bool| if ok { "yes" } else { "**no**" };
    s += &format!(
        "\nGoals (anchor: LiteLLM's proxy, about 2 ms median and 8 ms p95 added):\n\n\
         | goal | target | llmr | met |\n|---|---|---:|---|\n\
         | router-added latency, p50 | < 0.3 ms | {:.3} ms | {} |\n\
         | router-added latency, p99 | < 2 ms | {:.3} ms | {} |\n\
         | most proxied requests/s (best concurrency) | (report) | {best:.0} | - |\n",
        p50 / 1e6,
        met(p50 < 0.3e6),
        p99 / 1e6,
        met(p99 < 2e6),
    );
    s += &format!(
        "\nThe node answered {} of the {} requests it received from its answer cache.\n",
        m.node_cache_hits, m.node_requests
    );
    s
}

fn sh_quote(a: &str) -> String {
    if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@".contains(c)) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

fn command_line() -> String {
    let mut args = std::env::args();
    let exe = args.next().unwrap_or_default();
    let exe = Path::new(&exe).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or(exe);
    std::iter::once(format!("$CARGO_TARGET_DIR/release/{exe}"))
        .chain(args.map(|a| sh_quote(&a)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn git(args: &[&str]) -> String {
    Command::new("git")
        .args(args)
        .current_dir(repo())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("model name"))?.split_once(':').map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `YYYY-MM-DD` (UTC) from the system clock.
fn today() -> String {
    let days =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year}-{month:02}-{day:02}")
}

struct RunInfo {
    load_before: String,
    load_after: String,
    args_summary: String,
}

fn section(m: &Measured, ctx: &RunInfo) -> String {
    let commit = git(&["rev-parse", "--short", "HEAD"]);
    let dirty = if git(&["status", "--porcelain"]).is_empty() { "" } else { " (with uncommitted changes)" };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "\n### {} · commit {commit}{dirty} · {}, {cores} cores\n\n\
         Command: `{}` ({}). Load average (1, 5, 15 min) before: {}, after: {}.\n\
         Router: `llmr router --no-auth --allow-cpu-nodes` (release build); one node: `llmr node --threads 1 --slots 4`, \
         serving SmolLM2-135M-Instruct Q4_1 as `smol`. Every request is the same non-streamed chat request at \
         temperature 0 (`max_tokens` 4), which the node answers from its answer cache after one warm-up, so the \
         figures are HTTP and proxy work, not the engine. The load generator (Rust, reqwest, HTTP/1.1 keep-alive, \
         one client per side), the router and the node share the machine's {cores} cores, all on 127.0.0.1. \
         Latency: requests one at a time, direct and via the router alternating (pairs), time to the whole answer. \
         Throughput: closed-loop clients per concurrency, direct first, then via the router; every answer checked \
         to be 200. CPU per request: the processes' CPU time (`/proc/PID/task/*/schedstat`) over the requests.\n\n{}",
        today(),
        cpu_model(),
        command_line(),
        ctx.args_summary,
        ctx.load_before,
        ctx.load_after,
        tables(m)
    )
}

const RESULTS_HEADING: &str = "## Router overhead: via `llmr router` against the node directly (`router-bench`)";

fn append_results(text: &str) -> Result<PathBuf> {
    let path = repo().join("bench/RESULTS.md");
    let existing = std::fs::read_to_string(&path).unwrap_or_default();
    let mut f = std::fs::OpenOptions::new().append(true).create(true).open(&path)?;
    if !existing.contains(RESULTS_HEADING) {
        write!(f, "\n{RESULTS_HEADING}\n\nSetup: `bench/README.md` (\"Router\").\n")?;
    }
    f.write_all(text.as_bytes())?;
    Ok(std::fs::canonicalize(&path)?)
}

// ---- main ----

async fn run(args: &Args, slot: &mut Option<Cluster>) -> Result<()> {
    let llmr = args.llmr.clone().unwrap_or_else(default_llmr);
    if !llmr.is_file() {
        bail!("{} not found: cargo build --release -p llmr (or pass --llmr)", llmr.display());
    }
    let (pairs, warmup, secs) = if args.smoke { (50, 10, 1.0) } else { (args.requests, 200, args.seconds) };
    let load_before = load_average();
    let cluster = slot.insert(start_cluster(&llmr, args)?);
    let (direct, router) =
        (Target::new(&cluster.node().url, Some(NODE_KEY))?, Target::new(&cluster.router().url, None)?);
    let fail = |e: anyhow::Error, c: &Cluster| anyhow!("{e:#}{}", c.logs());

    let t = Instant::now();
    wait_until_routable(cluster, &router).await.map_err(|e| fail(e, cluster))?;
    eprintln!("router-bench: `{MODEL}` answers through the router after {:.1} s", t.elapsed().as_secs_f64());
    direct.call().await.map_err(|e| fail(e.context("direct warm-up"), cluster))?;
    let hits_before = cache_hits(cluster, &direct.client).await?;
    let sent_before = direct.sent.load(Ordering::Relaxed) + router.sent.load(Ordering::Relaxed);

    eprintln!("router-bench: latency, {pairs} pairs (+{warmup} warm-up)");
    let latency = latency(&direct, &router, pairs, warmup, cluster).await.map_err(|e| fail(e, cluster))?;
    let mut rates = Vec::new();
    for &c in &args.concurrency {
        let (warm, measure) = (Duration::from_secs_f64(secs / 10.0), Duration::from_secs_f64(secs));
        eprintln!("router-bench: throughput, c={c}, {secs} s each side");
        let d = throughput(&direct, c, warm, measure, cluster)
            .await
            .map_err(|e| fail(e.context(format!("c={c} direct")), cluster))?;
        let r = throughput(&router, c, warm, measure, cluster)
            .await
            .map_err(|e| fail(e.context(format!("c={c} via router")), cluster))?;
        rates.push((c, d, r));
    }
    let hits = cache_hits(cluster, &direct.client).await? - hits_before;
    let sent = direct.sent.load(Ordering::Relaxed) + router.sent.load(Ordering::Relaxed) - sent_before;
    let measured = Measured { latency, rates, node_requests: sent, node_cache_hits: hits };
    let ctx = RunInfo {
        load_before,
        load_after: load_average(),
        args_summary: format!(
            "{pairs} latency pairs after {warmup} warm-up pairs; {secs} s per concurrency and side after {:.1} s warm-up; load generator threads: {}",
            secs / 10.0,
            args.client_threads
        ),
    };
    let text = section(&measured, &ctx);
    println!("{text}");
    if hits != sent {
        // Then the engine ran, and the figures are not the router's overhead.
        bail!("only {hits} of the {sent} requests were answered from the node's cache; nothing written");
    }
    if args.write {
        let path = append_results(&text)?;
        eprintln!("router-bench: appended to {}", path.display());
    }
    Ok(())
}

async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) =
        (signal(SignalKind::interrupt()), signal(SignalKind::terminate()), signal(SignalKind::hangup()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match args.client_threads {
        0 | 1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build(),
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("router-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The children live here, outside the measuring future, so that they are killed on every
    // exit: success, error, signal (the future is dropped) and panic (unwinding drops them).
    let mut cluster: Option<Cluster> = None;
    let result = runtime.block_on(async {
        tokio::select! {
            r = run(&args, &mut cluster) => r,
            s = interrupted() => Err(anyhow!("stopped by {s}")),
        }
    });
    drop(cluster);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("router-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
