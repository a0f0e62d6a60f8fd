"""Fixtures: the real `llmr serve` binary as a child process on loopback, and SDK clients for it.

Environment:
  LLMR_BIN           the llmr binary (default $CARGO_TARGET_DIR/debug/llmr, CARGO_TARGET_DIR
                     defaulting to ~/.cache/llmr/target)
  LLMR_MODEL_CACHE   the GGUF files (default ~/.cache/llmr/models; scripts/fetch-models fills it)
  LLMR_ENGINES_DIR   the installed engine plugins (default <repo>/engines; scripts/install-engines)

Each server gets a random API key, its own temporary store/config (so nothing from ~/.llmr or
LLMR_* variables leaks in), `--cache-mib 0` (every answer is really generated) and a log file
under pytest's temporary directory; the paths of the logs are printed at the end of the run.
Servers are stopped at the end of the session, also when tests fail; on Linux the child is also
bound to this process with PR_SET_PDEATHSIG, so even a killed pytest leaves no orphan.
"""

from __future__ import annotations

import ctypes
import io
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import wave
from collections import deque
from pathlib import Path

import anthropic
import openai
import pytest
import requests

REPO_ROOT = Path(__file__).resolve().parents[2]

# Alias -> file (or model folder) name in the model cache (scripts/fetch-models smollm2 qwen2.5
# minilm). LLMR_E2E_SMOLLM2 swaps the default model, e.g. `smollm2-hf` runs the suite on the same
# model in Hugging Face layout through the native engine.
MODEL_FILES = {
    "smollm2": os.environ.get("LLMR_E2E_SMOLLM2", "smollm2-135m-instruct-q4_1.gguf"),
    "qwen": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "minilm": "all-minilm-l6-v2-f16.gguf",
    # Speech: Whisper tiny.en (whisper.cpp) and a Piper voice (ONNX Runtime).
    "whisper": "whisper/ggml-tiny.en.bin",
    "voice": "piper-joe",
}
FETCH_NAMES = {"smollm2": "smollm2", "qwen": "qwen2.5", "minilm": "minilm", "whisper": "whisper-tiny.en",
               "voice": "piper-joe onnxruntime"}

LISTENING = re.compile(r"llmr listening on (http://\S+) \(models: ([^;]*); default (\S+)\)")
START_TIMEOUT_S = 90

# Never send loopback traffic through a proxy configured in the environment.
for _var in ("NO_PROXY", "no_proxy"):
    os.environ[_var] = ",".join(filter(None, ["127.0.0.1", "localhost", os.environ.get(_var)]))

_started: list["Child"] = []


def _expand(path: str) -> Path:
    p = Path(os.path.expandvars(os.path.expanduser(path)))
    return p if p.is_absolute() else (REPO_ROOT / p)


def llmr_binary() -> Path:
    if os.environ.get("LLMR_BIN"):
        return _expand(os.environ["LLMR_BIN"])
    target = os.environ.get("CARGO_TARGET_DIR") or "~/.cache/llmr/target"
    return _expand(target) / "debug" / "llmr"


def model_cache() -> Path:
    return _expand(os.environ.get("LLMR_MODEL_CACHE") or "~/.cache/llmr/models")


def engines_dir() -> Path:
    return _expand(os.environ.get("LLMR_ENGINES_DIR") or str(REPO_ROOT / "engines"))


def check_prerequisites(models: list[str]) -> None:
    """Fails (not skips) with what to run when something the servers need is missing."""
    binary = llmr_binary()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.fail(
            f"the llmr binary {binary} does not exist or is not executable: build it with "
            "`cargo build -p llmr` (same CARGO_TARGET_DIR) or point LLMR_BIN at one",
            pytrace=False,
        )
    manifests = list(engines_dir().glob("*/*/manifest.json"))
    if not manifests:
        pytest.fail(f"no engine plugin under {engines_dir()}: run scripts/install-engines", pytrace=False)
    for alias in models:
        path = model_cache() / MODEL_FILES[alias]
        if not path.exists():
            pytest.fail(
                f"model file {path} is missing: run `scripts/fetch-models {FETCH_NAMES[alias]}` "
                "(or set LLMR_MODEL_CACHE to the folder holding it)",
                pytrace=False,
            )


def _bind_to_parent():  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


class Child:
    """One llmr child process: its stderr goes to a log file and a tail kept for failure messages;
    `start` waits for the line matching `ready` and returns the match."""

    def __init__(self, name: str, log_path: Path):
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._tail: deque[str] = deque(maxlen=60)
        self._reader: threading.Thread | None = None

    def start(self, cmd: list[str], ready: re.Pattern, cwd: Path, home: Path | None = None,
              extra_env: dict[str, str] | None = None) -> re.Match:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMR_")}
        if home is not None:
            env["HOME"] = str(home)
        env.update(extra_env or {})
        log = open(self.log_path, "w", encoding="utf-8", errors="replace")
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            preexec_fn=_bind_to_parent if sys.platform.startswith("linux") else None,
        )
        _started.append(self)
        found: list[re.Match] = []
        listening = threading.Event()

        def pump(stream=self.proc.stderr):
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                log.write(line)
                log.flush()
                self._tail.append(line.rstrip("\n"))
                m = ready.search(line)
                if m and not listening.is_set():
                    found.append(m)
                    listening.set()
            log.close()

        self._reader = threading.Thread(target=pump, name=f"llmr-{self.name}-stderr", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not listening.wait(0.05):
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise RuntimeError(
                    f"{self.name} exited with status {self.proc.returncode} before listening:\n" + self.tail()
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} printed no listening line in {START_TIMEOUT_S}s:\n" + self.tail())
        return found[0]

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        if self._reader is not None:
            self._reader.join(5)
        return self.proc.returncode

    def tail(self, lines: int = 40) -> str:
        return "\n".join(list(self._tail)[-lines:])


class Endpoint:
    """What tests reach: a base URL and its API key (a `llmr serve`, or a router with nodes)."""

    base_url = ""  # http://127.0.0.1:PORT
    api_key = ""

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"}

    def client(self, **kwargs) -> openai.OpenAI:
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 120.0)
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.api_key, **kwargs)

    def anthropic(self, **kwargs) -> anthropic.Anthropic:
        """The official Anthropic SDK, authenticating with `x-api-key` as it does."""
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 120.0)
        return anthropic.Anthropic(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def post(self, path: str, body=None, *, data=None, headers=None, **kwargs) -> requests.Response:
        h = dict(self.auth)
        h.update(headers or {})
        kwargs.setdefault("timeout", 120)
        return requests.post(self.base_url + path, json=body, data=data, headers=h, **kwargs)

    def get(self, path: str, *, headers=None, **kwargs) -> requests.Response:
        h = dict(self.auth)
        h.update(headers or {})
        kwargs.setdefault("timeout", 30)
        return requests.get(self.base_url + path, headers=h, **kwargs)

    def metrics(self) -> dict[str, float]:
        """The /metrics samples, by their full name with labels as printed."""
        r = self.get("/metrics")
        r.raise_for_status()
        out = {}
        for line in r.text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def metric(self, name: str, **labels) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for key, value in self.metrics().items():
            base, _, rest = key.partition("{")
            if base != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', rest))
            if all(have.get(k) == v for k, v in labels.items()):
                total += value
        return total



class LlmrServer(Endpoint):
    """One `llmr serve` child process."""

    def __init__(self, name: str, workdir: Path, models: list[str], extra_args: list[str]):
        self.name = name
        self.workdir = workdir
        self.models = models
        self.extra_args = extra_args
        self.api_key = "sk-llmr-e2e-" + secrets.token_hex(16)
        self.child = Child(f"llmr serve ({name})", workdir / "llmr.log")
        self.base_url = ""  # http://127.0.0.1:PORT
        self.default_model = ""

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.child.proc

    @property
    def log_path(self) -> Path:
        return self.child.log_path

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "LlmrServer":
        check_prerequisites(self.models)
        store = self.workdir / "store"
        store.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.toml"
        config.write_text("# empty: every setting comes from the command line\n")
        cmd = [
            str(llmr_binary()), "serve",
            "--host", "127.0.0.1", "--port", "0",
            "--engines-dir", str(engines_dir()),
            "--store", str(store), "--config", str(config),
            "--api-key", self.api_key,
            "--cache-mib", "0",
        ]
        for alias in self.models:
            cmd += ["--model", f"{alias}={model_cache() / MODEL_FILES[alias]}"]
        cmd += self.extra_args
        m = self.child.start(cmd, LISTENING, self.workdir)
        self.base_url, self.default_model = m.group(1), m.group(3)
        return self

    def stop(self) -> int | None:
        return self.child.stop()

    def tail(self, lines: int = 40) -> str:
        return self.child.tail(lines)

ROUTER_LISTENING = re.compile(r"llmr router listening on (http://\S+)")
NODE_LISTENING = re.compile(r"llmr node listening on (http://\S+)")
CLUSTER_READY_TIMEOUT_S = 240


class LlmrCluster(Endpoint):
    """`llmr router` with one `llmr node` under it, serving `models` registered by path (the
    node uses the files in place), with keys made by `llmr keys create` in the router's database."""

    def __init__(self, workdir: Path, models: list[str]):
        self.workdir = workdir
        self.models = models
        self.db = workdir / "router.db"
        self.router = Child("llmr router", workdir / "router.log")
        self.node = Child("llmr node", workdir / "node.log")

    def _key(self, name: str, scope: str) -> str:
        out = subprocess.run(
            [str(llmr_binary()), "keys", "create", "--name", name, "--scope", scope, "--db", str(self.db)],
            capture_output=True, text=True, env={k: v for k, v in os.environ.items() if not k.startswith("LLMR_")},
            timeout=60,
        )
        assert out.returncode == 0, f"llmr keys create: {out.stderr}"
        return out.stdout.strip()

    def start(self) -> "LlmrCluster":
        check_prerequisites(self.models)
        self.admin_key, self.api_key = self._key("admin", "admin"), self._key("e2e", "api")
        admin, node = self.admin_key, self._key("nodes", "node")
        self.node_key = node
        m = self.router.start(
            [str(llmr_binary()), "router", "--host", "127.0.0.1", "--port", "0", "--allow-cpu-nodes",
             "--db", str(self.db)],
            ROUTER_LISTENING, self.workdir, home=self.workdir,
        )
        self.base_url = m.group(1)
        for alias in self.models:
            r = requests.post(
                self.base_url + "/v0/models",
                json={"path": str(model_cache() / MODEL_FILES[alias]), "name": alias},
                headers={"Authorization": f"Bearer {admin}"}, timeout=120,
            )
            assert r.status_code in (200, 201), f"registering {alias}: {r.status_code} {r.text}"
        store = self.workdir / "node-store"
        store.mkdir(exist_ok=True)
        self.node.start(
            [str(llmr_binary()), "node", "--router", self.base_url, "--token", node, "--name", "e2e-node",
             "--port", "0", "--store", str(store), "--engines-dir", str(engines_dir()), "--cache-mib", "0"],
            NODE_LISTENING, self.workdir, home=self.workdir,
            # The node's HOME is the test's folder: tell the TTS plugin where ONNX Runtime is.
            extra_env={"ORT_DYLIB_PATH": str(model_cache() / "onnxruntime" / "libonnxruntime.so.1.31.1")},
        )
        # Ready when each model answers through the router (the node syncs, hashes and loads it).
        deadline = time.monotonic() + CLUSTER_READY_TIMEOUT_S
        for alias in self.models:
            while True:
                r = self._probe(alias)
                if r.status_code == 200:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{alias} not served through the router in {CLUSTER_READY_TIMEOUT_S}s: {r.status_code} "
                        f"{r.text}\n--- router\n{self.router.tail()}\n--- node\n{self.node.tail()}"
                    )
                time.sleep(0.5)
        return self

    def _probe(self, alias: str) -> requests.Response:
        """The smallest request `alias` answers: a token, a word spoken, or a breath of silence heard."""
        if alias == "voice":
            return self.post("/v1/audio/speech", {"model": alias, "input": "Hi.", "voice": "alloy"})
        if alias == "whisper":
            silence = io.BytesIO()
            with wave.open(silence, "wb") as w:
                w.setnchannels(1), w.setsampwidth(2), w.setframerate(16_000), w.writeframes(b"\x00\x00" * 8_000)
            return self.post("/v1/audio/transcriptions", data={"model": alias},
                             files={"file": ("silence.wav", silence.getvalue())})
        return self.post("/v1/completions", {"model": alias, "prompt": "Hi", "max_tokens": 1})

    def stop(self) -> None:
        self.node.stop()
        self.router.stop()


def _start(tmp_path_factory, name: str, models: list[str], extra: list[str]) -> LlmrServer:
    return LlmrServer(name, tmp_path_factory.mktemp(f"llmr-{name}"), models, extra).start()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """smollm2 (default, preloaded), qwen, minilm, whisper and voice."""
    s = _start(tmp_path_factory, "main", ["smollm2", "qwen", "minilm", "whisper", "voice"], [])
    yield s
    s.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """`llmr router` and one `llmr node` serving qwen."""
    c = LlmrCluster(tmp_path_factory.mktemp("llmr-cluster"), ["qwen"]).start()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def speech_cluster(tmp_path_factory):
    """`llmr router` and one `llmr node` serving whisper and voice, registered by path."""
    c = LlmrCluster(tmp_path_factory.mktemp("llmr-speech-cluster"), ["whisper", "voice"]).start()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def small_ctx_server(tmp_path_factory):
    """smollm2 with a 256-token context per request."""
    s = _start(tmp_path_factory, "ctx256", ["smollm2"], ["--ctx-size", "256"])
    yield s
    s.stop()


@pytest.fixture(scope="session")
def limited_server(tmp_path_factory):
    """smollm2 with one slot and one queue place: a third concurrent request gets 429."""
    s = _start(tmp_path_factory, "slots1", ["smollm2"], ["--slots", "1", "--queue-limit", "1"])
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    return server.client()


def pytest_terminal_summary(terminalreporter):
    if not _started:
        return
    terminalreporter.write_sep("-", "llmr servers started by tests/e2e")
    for s in _started:
        status = s.proc.returncode if s.proc is not None else None
        terminalreporter.write_line(f"{s.name}: exit={status} log={s.log_path}")


def pytest_sessionfinish(session, exitstatus):
    # Belt and braces: fixtures stop their servers; this catches any left by an interrupted run.
    for s in _started:
        try:
            s.stop()
        except Exception:
            pass
