//! The harness shared by the fuzz tests of issue 16 ("untrusted files never crash anything"):
//! each `fuzz_*.rs` test includes this file with `#[path]` and hands [`fuzz`] a proptest strategy
//! and a property. What it adds to proptest:
//!
//! - Case counts from the environment: `LLMR_FUZZ_CASES` (default: the test's own, small enough
//!   for CI in debug builds), or `LLMR_FUZZ_SECS` for a run bounded by time (cases are generated
//!   in chunks until the time is up); `LLMR_FUZZ_SEED` fixes the random seed (a time-bounded run
//!   picks a fresh one and prints it). The count of cases run is printed to stderr.
//! - A watchdog: a case running longer than `LLMR_FUZZ_CASE_TIMEOUT_SECS` (default 10) is a
//!   hang; its input is written to a file under the target directory and the process aborts.
//! - An allocation guard: the test binary's allocator refuses any single allocation larger than
//!   `LLMR_FUZZ_ALLOC_LIMIT_MB` (default 256). The inputs are small, so such a request can only
//!   come from a length field believed without checking; refused, it aborts the process (the
//!   input is written out first) instead of succeeding on an overcommitting system unnoticed.
//! - Panics fail the case that was running, also those on threads it started (a Tokio runtime's
//!   workers and blocking pool, a server's), which a task's `JoinError` would otherwise turn
//!   into an ordinary error: threads named `fuzz-*` (name a test's runtime so) or `tokio-*`.
//! - Byte-level and JSON-level mutators of committed seed files.
#![allow(dead_code)]

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use serde_json::Value;
use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

// ---- allocation guard ----

struct Guarded;

static ALLOC_LIMIT: AtomicUsize = AtomicUsize::new(256 << 20);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static REPORTING: AtomicBool = AtomicBool::new(false);

#[cold]
fn refuse(size: usize) -> *mut u8 {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    // The report allocates (small blocks, which pass); a second huge request while reporting is
    // refused silently.
    if !REPORTING.swap(true, Ordering::SeqCst) {
        dump_all(&format!("refused an allocation of {size} bytes (limit: LLMR_FUZZ_ALLOC_LIMIT_MB)"));
        REPORTING.store(false, Ordering::SeqCst);
    }
    std::ptr::null_mut()
}

// SAFETY: every call is forwarded to the system allocator unchanged, except that requests over the
// limit get a null pointer, which `GlobalAlloc` allows (allocation failure).
unsafe impl GlobalAlloc for Guarded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT.load(Ordering::Relaxed) {
            return refuse(layout.size());
        }
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT.load(Ordering::Relaxed) {
            return refuse(layout.size());
        }
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOC_LIMIT.load(Ordering::Relaxed) {
            return refuse(new_size);
        }
        // SAFETY: the caller's contract is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Guarded = Guarded;

// ---- watchdog, panic counter and input dumps ----

/// One running fuzz test: the case it is running and since when.
struct Slot {
    name: String,
    /// Milliseconds since [`epoch`] (plus one) when the current case started; 0 when idle.
    started: AtomicU64,
    input: Mutex<Vec<u8>>,
    /// How the cases ended, by [`note`]'s labels.
    outcomes: Mutex<std::collections::BTreeMap<String, u64>>,
}

static SLOTS: Mutex<Vec<Arc<Slot>>> = Mutex::new(Vec::new());
static PANICS: AtomicU64 = AtomicU64::new(0);
static DUMPS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static CURRENT: std::cell::RefCell<Option<Arc<Slot>>> = const { std::cell::RefCell::new(None) };
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64 + 1
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|_| panic!("{name}={value:?} is not a whole number")))
}

/// Where failing inputs are written: the target directory's scratch folder for tests.
fn dump_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures")
}

/// Writes `bytes` to a new file under [`dump_dir`] and returns its path.
pub fn dump(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = dump_dir();
    let _ = std::fs::create_dir_all(&dir);
    let n = DUMPS.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("{name}-{}-{n}.bin", std::process::id()));
    if let Err(e) = std::fs::write(&path, bytes) {
        eprintln!("fuzz: could not write {}: {e}", path.display());
    }
    path
}

/// Reports `why` with the input of every case now running, written to files.
fn dump_all(why: &str) {
    eprintln!("fuzz: {why}");
    let Ok(slots) = SLOTS.try_lock() else { return };
    for slot in slots.iter().filter(|s| s.started.load(Ordering::SeqCst) != 0) {
        if let Ok(input) = slot.input.try_lock() {
            let path = dump(&slot.name, &input);
            eprintln!("fuzz: {} was running a case, its input is in {}", slot.name, path.display());
        }
    }
}

fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        if let Some(mb) = env_u64("LLMR_FUZZ_ALLOC_LIMIT_MB") {
            ALLOC_LIMIT.store((mb as usize).saturating_mul(1 << 20), Ordering::Relaxed);
        }
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // Panics on a test's own thread fail that test (proptest catches them); these are
            // the threads a case started (runtimes, servers), whose panics would go unnoticed.
            let thread = std::thread::current();
            let name = thread.name().unwrap_or_default();
            if name.starts_with("fuzz-") || name.starts_with("tokio-") || name == "hub-mirror" {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info)
        }));
        let timeout_ms = env_u64("LLMR_FUZZ_CASE_TIMEOUT_SECS").unwrap_or(10) * 1000;
        epoch();
        std::thread::Builder::new()
            .name("fuzz-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(200));
                let now = now_ms();
                let hung = SLOTS.lock().unwrap_or_else(|e| e.into_inner()).iter().find_map(|s| {
                    let started = s.started.load(Ordering::SeqCst);
                    (started != 0 && now.saturating_sub(started) > timeout_ms).then(|| s.name.clone())
                });
                if let Some(name) = hung {
                    dump_all(&format!("HANG: a case of {name} has run for more than {} s", timeout_ms / 1000));
                    std::process::abort();
                }
            })
            .expect("the watchdog thread starts");
    });
}

/// Runs `f` as the current case of this thread's fuzz test: `input` is what gets written out if
/// the case hangs or allocates without bound. Outside [`fuzz`], just runs `f`.
pub fn watch<R>(input: &[u8], f: impl FnOnce() -> R) -> R {
    let slot = CURRENT.with(|c| c.borrow().clone());
    let Some(slot) = slot else { return f() };
    {
        let mut saved = slot.input.lock().unwrap_or_else(|e| e.into_inner());
        saved.clear();
        saved.extend_from_slice(input);
    }
    /// Marks the case over however it ends (a panic unwinds through here).
    struct Running<'a>(&'a Slot);
    impl Drop for Running<'_> {
        fn drop(&mut self) {
            self.0.started.store(0, Ordering::SeqCst);
        }
    }
    slot.started.store(now_ms(), Ordering::SeqCst);
    let _running = Running(&slot);
    f()
}

/// Counts an outcome of the current case (`ok`, or the kind of error), for the summary a fuzz
/// test prints: inputs that all fail at the first check would test little.
pub fn note(label: &str) {
    CURRENT.with(|c| {
        if let Some(slot) = c.borrow().as_ref() {
            *slot.outcomes.lock().unwrap_or_else(|e| e.into_inner()).entry(label.to_string()).or_default() += 1;
        }
    });
}

/// The variant name of an error's `Debug` form (`Truncated { .. }` gives `Truncated`).
pub fn variant(error: &impl Debug) -> String {
    let text = format!("{error:?}");
    text.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or_default().to_string()
}

/// Runs the property `test` over inputs from `strategy`: `LLMR_FUZZ_CASES` cases (default
/// `default_cases`), or as many as fit in `LLMR_FUZZ_SECS` seconds. Fails on the first input
/// (shrunk by proptest) that panics anywhere, breaks a `prop_assert`, hangs (abort) or asks for
/// an unbounded allocation (abort); prints the count of cases run.
pub fn fuzz<S>(name: &str, default_cases: u32, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    init();
    let secs = env_u64("LLMR_FUZZ_SECS");
    let cases = env_u64("LLMR_FUZZ_CASES").map_or(default_cases, |n| n.min(u32::MAX.into()) as u32);
    let seed = env_u64("LLMR_FUZZ_SEED").unwrap_or_else(|| match secs {
        // Long runs explore new ground each time; short ones are repeatable.
        Some(_) => {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        }
        None => name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)),
    });
    let chunk = if secs.is_some() { 256 } else { cases.max(1) };
    let config = Config {
        cases: chunk,
        failure_persistence: None,
        max_shrink_iters: 2048,
        max_global_rejects: u32::MAX,
        ..Config::default()
    };
    let mut rng_seed = [0u8; 32];
    rng_seed[..8].copy_from_slice(&seed.to_le_bytes());
    // A runner runs its `cases` once (it counts its successes), so each chunk of a long run gets
    // a fresh runner, with an RNG drawn from this one's.
    let mut rngs = TestRunner::new_with_rng(config.clone(), TestRng::from_seed(RngAlgorithm::ChaCha, &rng_seed));

    let slot = Arc::new(Slot {
        name: name.to_string(),
        started: AtomicU64::new(0),
        input: Mutex::new(Vec::new()),
        outcomes: Mutex::default(),
    });
    SLOTS.lock().unwrap_or_else(|e| e.into_inner()).push(slot.clone());
    CURRENT.with(|c| *c.borrow_mut() = Some(slot.clone()));
    let ran = AtomicU64::new(0);
    let start = Instant::now();
    let deadline = secs.map(|s| start + Duration::from_secs(s));
    eprintln!("fuzz {name}: seed {seed}, {}", secs.map_or(format!("{cases} cases"), |s| format!("{s} s")));
    loop {
        let mut runner = TestRunner::new_with_rng(config.clone(), rngs.new_rng());
        let result = runner.run(&strategy, |value| {
            ran.fetch_add(1, Ordering::Relaxed);
            let panics = PANICS.load(Ordering::SeqCst);
            let outcome = test(value);
            if PANICS.load(Ordering::SeqCst) != panics {
                return Err(TestCaseError::fail("a thread panicked during this case (its message is above)"));
            }
            outcome
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(reason, value)) => {
                let text = format!("{value:?}");
                let path = dump(name, text.as_bytes());
                let shown: String = text.chars().take(4000).collect();
                CURRENT.with(|c| *c.borrow_mut() = None);
                panic!(
                    "fuzz {name}: FAILED after {} cases (seed {seed}): {reason}\nminimal input ({} chars, all in {}):\n{shown}",
                    ran.load(Ordering::Relaxed),
                    text.len(),
                    path.display()
                );
            }
            Err(TestError::Abort(reason)) => panic!("fuzz {name}: aborted (seed {seed}): {reason}"),
        }
        match deadline {
            Some(d) if Instant::now() < d => continue,
            _ => break,
        }
    }
    CURRENT.with(|c| *c.borrow_mut() = None);
    let outcomes = slot.outcomes.lock().unwrap_or_else(|e| e.into_inner());
    if !outcomes.is_empty() {
        let mut by_count: Vec<(&String, &u64)> = outcomes.iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(a.1));
        let shown: Vec<String> = by_count.iter().take(12).map(|(k, v)| format!("{k} {v}")).collect();
        eprintln!("fuzz {name}: outcomes: {}", shown.join(", "));
    }
    eprintln!(
        "fuzz {name}: {} cases in {:.1} s (seed {seed}): 0 panics, 0 hangs, {} oversized allocations refused",
        ran.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64(),
        REFUSED.load(Ordering::Relaxed)
    );
}

// ---- seeds ----

/// Seed inputs, shared by the strategies built from them.
pub type Seeds = Arc<Vec<Vec<u8>>>;

/// The seed files of `dir` (sorted by name), as (file name, bytes).
pub fn load_seeds(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("seed folder {}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("a seed folder entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        })
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

/// Checks that the committed seed `dir/name` holds `bytes` (what the test's generator makes),
/// or writes it when `LLMR_FUZZ_WRITE_SEEDS=1`.
pub fn check_seed(dir: &Path, name: &str, bytes: &[u8]) {
    let path = dir.join(name);
    if std::env::var("LLMR_FUZZ_WRITE_SEEDS").as_deref() == Ok("1") {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(&path, bytes).unwrap();
        return;
    }
    let committed =
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (LLMR_FUZZ_WRITE_SEEDS=1 writes it)", path.display()));
    assert!(committed == bytes, "{} differs from its generator; LLMR_FUZZ_WRITE_SEEDS=1 rewrites it", path.display());
}

// ---- byte mutations ----

/// Integers that break length and count fields.
pub fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..4096,
        1 => Just(0u64),
        1 => Just(u64::MAX),
        1 => Just(1u64 << 60),
        1 => Just(1u64 << 63),
        1 => Just(i64::MAX as u64),
        1 => Just(u64::from(u32::MAX)),
        1 => Just(u64::from(u32::MAX) + 1),
        1 => Just(1u64 << 32),
        1 => Just(1u64 << 40),
        1 => Just(usize::MAX as u64 / 2 + 1),
        2 => any::<u64>(),
    ]
}

#[derive(Clone, Debug)]
pub enum Mutation {
    FlipBit(Index, u8),
    SetByte(Index, u8),
    /// Cut the input at this point.
    Truncate(Index),
    Insert(Index, Vec<u8>),
    /// Remove up to this many bytes.
    Delete(Index, usize),
    /// Copy a run of up to `usize` bytes from the first place to the second.
    Duplicate(Index, usize, Index),
    /// Overwrite a little-endian integer (8 bytes, or 4 when `bool`).
    Int(Index, u64, bool),
    /// Replace everything from the first place on with another seed's bytes from the second.
    Splice(Index, Index, Index),
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::SetByte(i, b)),
        2 => any::<Index>().prop_map(Mutation::Truncate),
        2 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..32)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        2 => (any::<Index>(), 1usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
        1 => (any::<Index>(), 1usize..256, any::<Index>()).prop_map(|(a, n, b)| Mutation::Duplicate(a, n, b)),
        3 => (any::<Index>(), interesting_u64(), any::<bool>()).prop_map(|(i, v, w)| Mutation::Int(i, v, w)),
        1 => (any::<Index>(), any::<Index>(), any::<Index>()).prop_map(|(a, s, b)| Mutation::Splice(a, s, b)),
    ]
}

/// `i` as a position in `0..len` (0 when empty).
pub fn at(i: &Index, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        i.index(len)
    }
}

pub fn apply(bytes: &mut Vec<u8>, m: &Mutation, seeds: &[Vec<u8>]) {
    let len = bytes.len();
    match m {
        Mutation::FlipBit(i, bit) if len > 0 => bytes[at(i, len)] ^= 1 << bit,
        Mutation::SetByte(i, b) if len > 0 => bytes[at(i, len)] = *b,
        Mutation::Truncate(i) => bytes.truncate(at(i, len + 1)),
        Mutation::Insert(i, run) => {
            let p = at(i, len + 1);
            bytes.splice(p..p, run.iter().copied());
        }
        Mutation::Delete(i, n) if len > 0 => {
            let p = at(i, len);
            bytes.drain(p..(p + n).min(len));
        }
        Mutation::Duplicate(from, n, to) if len > 0 => {
            let p = at(from, len);
            let run: Vec<u8> = bytes[p..(p + n).min(len)].to_vec();
            let q = at(to, len + 1);
            bytes.splice(q..q, run);
        }
        Mutation::Int(i, v, narrow) => {
            let le = v.to_le_bytes();
            let w = if *narrow { &le[..4] } else { &le[..] };
            let p = at(i, len + 1);
            let end = (p + w.len()).min(len);
            bytes.splice(p..end, w.iter().copied());
        }
        Mutation::Splice(here, which, there) if !seeds.is_empty() => {
            let other = &seeds[at(which, seeds.len())];
            let p = at(here, len + 1);
            let q = at(there, other.len() + 1);
            bytes.truncate(p);
            bytes.extend_from_slice(&other[q..]);
        }
        _ => {}
    }
}

/// A few byte mutations: mostly one or two, so that most inputs stay close to valid and get
/// deep into the reader, sometimes up to eight.
pub fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop_oneof![
        6 => prop::collection::vec(mutation(), 1..3),
        1 => prop::collection::vec(mutation(), 3..9),
    ]
}

/// No byte mutation three times in four, else a few.
pub fn maybe_mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop_oneof![3 => Just(Vec::new()), 1 => mutations()]
}

/// A seed with one to eight byte mutations.
pub fn mutated(seeds: Seeds) -> impl Strategy<Value = Vec<u8>> {
    (any::<Index>(), mutations()).prop_map(move |(i, ms)| {
        let mut bytes = seeds[at(&i, seeds.len())].clone();
        for m in &ms {
            apply(&mut bytes, m, &seeds);
        }
        bytes
    })
}

/// Random bytes, some starting with `prefix` (a format's magic) so they get past the first check.
pub fn noise(prefix: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
    (any::<bool>(), prop::collection::vec(any::<u8>(), 0..512)).prop_map(move |(magic, tail)| {
        let mut bytes = if magic { prefix.to_vec() } else { Vec::new() };
        bytes.extend(tail);
        bytes
    })
}

// ---- JSON mutations ----

/// Strings that paths, names and enums choke on.
pub fn odd_string() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(prop::sample::select(&b"abcxyz0129_-./:\\ "[..]), 0..16)
            .prop_map(|v| v.into_iter().map(char::from).collect::<String>()),
        2 => prop::collection::vec(any::<char>(), 0..12).prop_map(|v| v.into_iter().collect::<String>()),
        2 => prop::sample::select(vec![
            "", ".", "..", "../x", "../../etc/passwd", "/abs/path", "/", "a//b", "a/", "C:x", "a\\b", "\0", "x\0y",
            "é", "\u{202e}gguf.exe", "\u{feff}", "null", "true", "0", "-1", "1e309", "cpu", "cuda", "gguf",
            "safetensors", "ggml", "onnx", "text", "completion", "model.gguf", "model.safetensors",
            "model-00001-of-00002.safetensors", "Q4_K_M", "org/model", "org/model:Q4_0", "main", "llama",
        ])
        .prop_map(str::to_string),
        1 => (1usize..20_000, any::<char>()).prop_map(|(n, c)| std::iter::repeat_n(c, n).collect::<String>()),
    ]
}

/// JSON values of every type, with extreme numbers and odd strings.
pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        interesting_u64().prop_map(Value::from),
        prop_oneof![Just(0.5f64), Just(-0.0), Just(1e308), Just(-1e-308), Just(f64::MAX), any::<f64>()]
            .prop_map(Value::from),
        odd_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((odd_string(), inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Text that no `Value` holds: numbers out of every range, nesting past parsers' limits.
fn raw_token(which: usize) -> String {
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    match which % 14 {
        0 => "1e400".into(),
        1 => "-1e400".into(),
        2 => "18446744073709551616".into(),
        3 => "-9223372036854775809".into(),
        4 => "123456789012345678901234567890123456789012345678901234567890".into(),
        5 => "1e-400".into(),
        6 => "-0".into(),
        7 => nested(127),
        8 => nested(129),
        9 => nested(5000),
        10 => nested(200_000),
        11 => format!("{}1{}", "{\"a\":".repeat(300), "}".repeat(300)),
        12 => "\"\\ud800\"".into(),
        _ => "\"\\u0000\"".into(),
    }
}

#[derive(Clone, Debug)]
pub enum JsonOp {
    Replace(Index, Value),
    Delete(Index),
    /// Add a member (objects) or an element (arrays).
    Add(Index, String, Value),
    /// Change the node's type, keeping what can be kept.
    Retype(Index),
    /// Wrap the node in this many arrays.
    Wrap(Index, usize),
    /// Replace the node with a [`raw_token`].
    Raw(Index, usize),
    /// Replace a string with another (other nodes: unchanged), keeping the document's shape.
    Str(Index, String),
    /// Replace a number with another (other nodes: unchanged).
    Num(Index, u64),
}

pub fn json_op() -> impl Strategy<Value = JsonOp> {
    prop_oneof![
        4 => (any::<Index>(), json_value()).prop_map(|(i, v)| JsonOp::Replace(i, v)),
        2 => any::<Index>().prop_map(JsonOp::Delete),
        2 => (any::<Index>(), odd_string(), json_value()).prop_map(|(i, k, v)| JsonOp::Add(i, k, v)),
        3 => any::<Index>().prop_map(JsonOp::Retype),
        1 => (any::<Index>(), prop_oneof![1usize..4, Just(127), Just(129)]).prop_map(|(i, d)| JsonOp::Wrap(i, d)),
        2 => (any::<Index>(), 0usize..14).prop_map(|(i, r)| JsonOp::Raw(i, r)),
        10 => (any::<Index>(), odd_string()).prop_map(|(i, s)| JsonOp::Str(i, s)),
        2 => (any::<Index>(), interesting_u64()).prop_map(|(i, n)| JsonOp::Num(i, n)),
    ]
}

/// JSON pointers of the nodes of `v` down to 64 levels (deeper ones are not mutated: nesting
/// past parsers' limits comes from [`JsonOp::Wrap`] and [`raw_token`]), root first.
fn pointers(v: &Value, at: String, depth: usize, out: &mut Vec<String>) {
    out.push(at.clone());
    if depth >= 64 {
        return;
    }
    match v {
        Value::Array(items) => {
            items.iter().enumerate().for_each(|(i, x)| pointers(x, format!("{at}/{i}"), depth + 1, out))
        }
        Value::Object(map) => {
            for (k, x) in map {
                pointers(x, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), depth + 1, out)
            }
        }
        _ => {}
    }
}

/// The placeholder a raw token takes until the value is serialized.
fn placeholder(which: usize) -> Value {
    Value::String(format!("\u{1}RAW{which}\u{1}"))
}

pub fn apply_json(root: &mut Value, op: &JsonOp) {
    let mut all = Vec::new();
    pointers(root, String::new(), 0, &mut all);
    let pick = |i: &Index| all[at(i, all.len())].clone();
    match op {
        JsonOp::Replace(i, v) => {
            if let Some(node) = root.pointer_mut(&pick(i)) {
                *node = v.clone();
            }
        }
        JsonOp::Delete(i) => {
            let p = pick(i);
            let Some((parent, last)) = p.rsplit_once('/') else {
                *root = Value::Null;
                return;
            };
            let key = last.replace("~1", "/").replace("~0", "~");
            match root.pointer_mut(parent) {
                Some(Value::Object(map)) => {
                    map.remove(&key);
                }
                Some(Value::Array(items)) => {
                    if let Ok(n) = key.parse::<usize>() {
                        if n < items.len() {
                            items.remove(n);
                        }
                    }
                }
                _ => {}
            }
        }
        JsonOp::Add(i, k, v) => match root.pointer_mut(&pick(i)) {
            Some(Value::Object(map)) => {
                map.insert(k.clone(), v.clone());
            }
            Some(Value::Array(items)) => items.push(v.clone()),
            Some(node) => *node = Value::Object([(k.clone(), v.clone())].into_iter().collect()),
            None => {}
        },
        JsonOp::Retype(i) => {
            if let Some(node) = root.pointer_mut(&pick(i)) {
                *node = match node.take() {
                    Value::Null => Value::Object(Default::default()),
                    Value::Bool(b) => Value::String(b.to_string()),
                    Value::Number(n) => Value::String(n.to_string()),
                    Value::String(s) => s.parse::<f64>().ok().map_or(Value::from(s.len()), Value::from),
                    Value::Array(items) => {
                        Value::Object(items.into_iter().enumerate().map(|(i, x)| (i.to_string(), x)).collect())
                    }
                    Value::Object(map) => Value::Array(map.into_iter().map(|(_, x)| x).collect()),
                };
            }
        }
        JsonOp::Wrap(i, depth) => {
            if let Some(node) = root.pointer_mut(&pick(i)) {
                let mut v = node.take();
                for _ in 0..*depth {
                    v = Value::Array(vec![v]);
                }
                *node = v;
            }
        }
        JsonOp::Str(i, text) => {
            if let Some(node @ Value::String(_)) = root.pointer_mut(&pick(i)) {
                *node = Value::String(text.clone());
            }
        }
        JsonOp::Num(i, n) => {
            if let Some(node @ Value::Number(_)) = root.pointer_mut(&pick(i)) {
                *node = Value::from(*n);
            }
        }
        JsonOp::Raw(i, which) => {
            if let Some(node) = root.pointer_mut(&pick(i)) {
                *node = placeholder(*which);
            }
        }
    }
}

pub fn to_text(v: &Value, pretty: bool) -> String {
    let mut text = if pretty { serde_json::to_string_pretty(v) } else { serde_json::to_string(v) }.unwrap();
    for which in 0..14 {
        let quoted = serde_json::to_string(&placeholder(which)).unwrap();
        if text.contains(&quoted) {
            text = text.replace(&quoted, &raw_token(which));
        }
    }
    text
}

/// A JSON seed mutated as a document (values replaced by others of any type, members removed
/// or added, nesting, out-of-range numbers), then maybe as text: a key repeated, bytes changed.
pub fn json_mutated(seeds: Seeds) -> impl Strategy<Value = Vec<u8>> {
    let values: Arc<Vec<Value>> = Arc::new(
        seeds.iter().map(|s| serde_json::from_slice(s).expect("JSON seeds are valid JSON")).collect::<Vec<Value>>(),
    );
    (
        any::<Index>(),
        prop_oneof![2 => prop::collection::vec(json_op(), 1..2), 1 => prop::collection::vec(json_op(), 0..5)],
        any::<bool>(),
        prop::option::weighted(0.1, any::<Index>()),
        maybe_mutations(),
    )
        .prop_map(move |(i, ops, pretty, repeat_key, bytes_ops)| {
            let mut v = values[at(&i, values.len())].clone();
            for op in &ops {
                apply_json(&mut v, op);
            }
            let mut text = to_text(&v, pretty);
            // A member given twice: the first of the root's keys again, with a number.
            if let (Some(k), Value::Object(map)) = (repeat_key, &v) {
                if let Some(key) = map.keys().nth(at(&k, map.len().max(1))) {
                    if let Some(p) = text.find('{') {
                        text.insert_str(p + 1, &format!("{}: 7,", serde_json::to_string(key).unwrap()));
                    }
                }
            }
            let mut bytes = text.into_bytes();
            for m in &bytes_ops {
                apply(&mut bytes, m, &seeds);
            }
            bytes
        })
}

/// Every kind of JSON input from `seeds`: mutated as documents, as bytes, or random JSON.
pub fn json_inputs(seeds: Seeds) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => json_mutated(seeds.clone()),
        2 => mutated(seeds),
        1 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => noise(b"{"),
    ]
}
