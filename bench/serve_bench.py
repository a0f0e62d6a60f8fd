#!/usr/bin/env python3
"""The serving benchmark: `llmr serve` against llama.cpp's `llama-server`, side by side.

For each model, the reference llama-server (built by bench/reference/build.sh from the llama.cpp
tree of the PyPI sdist llama-cpp-python) and `llmr serve` are started ONE AFTER THE OTHER (never
together, so they never share the cores) on 127.0.0.1 with the same model file, thread count,
number of slots and KV cells (in the same layout), and the same load generator (this script, asyncio +
aiohttp, streaming, fixed seeds) drives both through the same workloads:

  single      one user, sequential requests: TTFT, inter-token latency p50/p95/p99, decode tok/s
  c=N         N closed-loop streaming clients (N = 1, 4, 8, 16) for a fixed window: aggregate
              output tok/s, requests/s, TTFT p50/p99
  shared      32 requests sharing a ~1,000-token system prompt, one after the other: TTFT of the
              first and of the rest
  long        2 short streaming clients alone, then while a ~2,000-token prompt is prefilled:
              inter-token p99 of the short streams without / during the prefill
  storm       50 streams opened at once and dropped after 3 tokens each, then normal requests:
              TTFT after the storm against TTFT before it
  grounded    answers that copy a passage of their prompt (greedy), one user then 8 at once:
              decode tok/s, and for llmr the share of speculative draft tokens kept
  multiturn   one chat of 10 turns over a ~700-token passage, each turn sending the whole
              conversation so far with the server's own answers: TTFT of turn 1 and of turns 2-10

and each server's memory: the KV cache its llama.cpp allocated (as llama.cpp reports it:
llama-server's log, llmr's `llmr_kv_cache_bytes`; the native engine allocates blocks as they fill,
so for it the figure is its budget, `llmr_kv_cache_budget_bytes`, the most it may hold) and its
resident set with its engine workers after the workloads.

It prints one table per model with both servers and the ratio llmr / llama-server per figure, and
the goals of the serving issue. Every request is bounded (max_tokens, client timeouts) and every
workload is bounded in count and time.

  bench/serve_bench.py [--models smollm2,gemma3] [--threads 2] [--write]
  bench/serve_bench.py --smoke          # a few requests per workload, both servers, SmolLM2 only
  bench/serve_bench.py --reference llmr-in-process   # llmr against itself with plugins in its own
                                        # process: what engine worker processes cost (issue 16)
  bench/serve_bench.py --reference llmr-no-spec      # llmr against itself with speculative
                                        # decoding off in every request (issue 17)
  bench/serve_bench.py --engine native --ctx 2048     # llmr's native engine on the Hugging Face
                                        # folder (bf16 safetensors) against llama-server on the F16
                                        # GGUF of the same values: the same weights in a 16-bit type

--write appends the table to bench/RESULTS.md with the date, commit, machine and command.
--smoke checks the harness (exit 1 on any failure: an HTTP error, a stream without tokens, missing
usage, a server that dies, a workload or figure missing from either server), not the speed: where
a measured run counts what fits in a time window, a smoke run waits for what its figures need
(within generous bounds), so a slow or busy machine passes too. It never writes.

The load generator needs aiohttp: the script creates ${LLMR_BENCH_VENV:-~/.cache/llmr/venv-bench},
installs bench/requirements-serve.txt into it (again only when that file changed) and re-runs itself
with the venv's python.
"""
import argparse
import asyncio
import datetime
import hashlib
import json
import math
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from soak import tree_rss_kib    # bench/soak.py: the same process-tree reading

REPO = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO / "bench/requirements-serve.txt"
VENV = Path(os.environ.get("LLMR_BENCH_VENV", Path.home() / ".cache/llmr/venv-bench"))
MODELS = {
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}
# `--engine native`: llmr serves the Hugging Face folder (its native engine), llama-server the F16
# GGUF holding the same values (both converted from the GGUF above by scripts/convert_gguf_hf.py);
# each pair is (llama-server's, llmr's).
NATIVE_MODELS = {name: (f"{name}-f16", f"{name}-hf") for name in MODELS}
# Where scripts/fetch-models caches each name (used with --no-build, when it does not run).
CACHED = {**MODELS, **{f"{n}-hf": f"{n}-hf" for n in MODELS}, "smollm2-f16": "smollm2-135m-instruct-f16.gguf",
          "gemma3-f16": "gemma-3-270m-f16.gguf", "qwen2.5-f16": "qwen2.5-coder-0.5b-instruct-f16.gguf"}
# Characters per token of the Hamlet corpus (measured with llama-server's /tokenize: 3.36-3.50 for
# SmolLM2 and Gemma 3). Prompt sizes below are targets; the tables report the real counts (usage).
CHARS_PER_TOKEN = 3.4
# llmr's KV cache has min(slots x ctx, max(ctx, 32768)) cells (engines/llama_cpp scheduler.rs
# `total_cells`), in a stream per sequence when slots x ctx fits that budget, else unified
# (`separate_streams`); llama-server gets the same cells as -c and the same layout.
LLMR_MAX_TOTAL_CELLS = 32768


def log(msg):
    print(f"[serve-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def die(msg):
    print(f"bench/serve_bench.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


# --- the venv ----------------------------------------------------------------------------------

def ensure_venv():
    """Runs the script under the bench venv, with bench/requirements-serve.txt installed."""
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
        log(f"installing {REQUIREMENTS.relative_to(REPO)} into {VENV}")
        stamp.unlink(missing_ok=True)
        r = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r",
                            str(REQUIREMENTS)], stdout=sys.stderr)
        if r.returncode != 0:
            die(f"pip install -r {REQUIREMENTS} failed")
        stamp.write_text(want + "\n")
    if Path(sys.prefix).resolve() != VENV.resolve():
        os.execv(str(py), [str(py), str(Path(sys.argv[0]).resolve()), *sys.argv[1:]])   # the script that called


# --- workload sizes ----------------------------------------------------------------------------

@dataclass
class Sizes:
    single_n: int = 12           # sequential requests
    single_prompt: int = 100     # target prompt tokens (passage)
    single_max: int = 128
    levels: tuple = (1, 4, 8, 16)
    level_warm: float = 2.0      # seconds before the measuring window opens
    level_dur: dict = field(default_factory=lambda: {1: 12.0, 4: 12.0, 8: 20.0, 16: 20.0})
    level_prompt: int = 80
    level_max: int = 128
    shared_n: int = 32
    shared_prefix: int = 1000
    shared_max: int = 16
    long_clients: int = 2
    long_short_prompt: int = 60
    long_short_max: int = 1024   # the short streams are dropped when the long prompt is done
    long_lead: float = 1.0       # seconds before measuring (the short streams' own prefill)
    long_baseline: float = 4.0   # seconds of short streams alone, then the long prompt is sent
    long_prompt: int = 2000
    storm_n: int = 50
    storm_prompt: int = 40
    storm_max: int = 256
    storm_drop_after: int = 3
    probe_n: int = 3             # normal requests before and after the storm
    probe_prompt: int = 100
    probe_max: int = 16
    grounded_n: int = 6          # sequential requests whose answer copies their prompt
    grounded_prompt: int = 150
    grounded_max: int = 160
    grounded_c: int = 8          # then this many at once
    turns: int = 10              # one conversation
    turn_passage: int = 700      # tokens of the passage in its first message
    turn_max: int = 48
    # --smoke checks the harness, not the speed: no workload may depend on how much a machine does
    # in a given time. Where a measured run counts what happens inside a time window, the smoke
    # run also waits (up to `smoke_wait` seconds) for the events its figures need: every client's
    # request finished, short-stream tokens before and during the long prefill.
    smoke: bool = False
    smoke_wait: float = 300.0


SMOKE = Sizes(single_n=2, single_max=16, levels=(1, 4), level_warm=0.5, level_dur={1: 2.0, 4: 2.0},
              level_max=16, shared_n=4, shared_prefix=200, long_short_max=256, long_baseline=1.5,
              long_lead=0.5, long_prompt=400, storm_n=8, storm_max=64, probe_n=2, grounded_n=2,
              grounded_prompt=60, grounded_max=24, grounded_c=2, turns=3, turn_passage=150, turn_max=12,
              smoke=True)


# --- prompts -----------------------------------------------------------------------------------

class Corpus:
    def __init__(self, path):
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        text = re.sub(r"\n\s*\n+", "\n", text)       # blank lines carry no text, only tokens
        start = text.find("ACT I.")
        self.text = text[start if start > 0 else 0:]

    def passage(self, tokens, key):
        """About `tokens` tokens of Hamlet from a place fixed by `key` (same for both servers)."""
        n = int(tokens * CHARS_PER_TOKEN)
        rng = random.Random(key)
        off = rng.randrange(0, max(1, len(self.text) - n))
        nl = self.text.find("\n", off)                 # start at a line
        off = nl + 1 if 0 <= nl < off + 200 else off
        return self.text[off:off + n]


def seed_of(key):
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") & 0x7FFFFFFF


# --- the client --------------------------------------------------------------------------------

class HarnessError(Exception):
    pass


@dataclass
class Result:
    sent: float
    times: list            # arrival time of every chunk carrying content
    usage: dict | None
    end: float
    dropped: bool = False
    text: str = ""         # the content, as streamed

    @property
    def ttft(self):
        return self.times[0] - self.sent

    @property
    def tokens(self):
        return self.usage["completion_tokens"] if self.usage else len(self.times)

    def gaps(self):
        return [b - a for a, b in zip(self.times, self.times[1:])]


class Client:
    def __init__(self, session, base, model, temperature, extra=None):
        self.session, self.base, self.url = session, base, base + "/v1/chat/completions"
        self.model, self.temperature = model, temperature
        self.extra = extra or {}               # fields every request carries (llmr's `speculative`)
        self.requests = 0

    async def draft_counters(self):
        """llmr's speculative-decoding counters (drafted, kept) from /metrics; None elsewhere."""
        async with self.session.get(self.base + "/metrics") as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
        got = {}
        for line in text.splitlines():
            for key in ("llmr_spec_decode_draft_tokens_total", "llmr_spec_decode_accepted_tokens_total"):
                if line.startswith(key + "{"):
                    got[key] = got.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        if len(got) != 2:
            return None
        return got["llmr_spec_decode_draft_tokens_total"], got["llmr_spec_decode_accepted_tokens_total"]

    async def chat(self, messages, max_tokens, seed, drop_after=None, sink=None, temperature=None):
        """One streamed chat request; with drop_after, closes the connection after that many chunks.

        `sink` gets the Result at once; its `times` fill in as chunks arrive (for streams that
        the caller cancels)."""
        import aiohttp
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True},
                "temperature": self.temperature if temperature is None else temperature, "seed": seed, **self.extra}
        self.requests += 1
        res = Result(time.perf_counter(), [], None, 0.0)
        if sink:
            sink(res)
        times = res.times
        try:
            async with self.session.post(self.url, json=body) as resp:
                if resp.status != 200:
                    raise HarnessError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    now = time.perf_counter()
                    obj = json.loads(data)
                    if "error" in obj:
                        raise HarnessError(f"error in stream: {json.dumps(obj)[:300]}")
                    if obj.get("usage"):
                        res.usage = obj["usage"]
                    for ch in obj.get("choices") or []:
                        if (ch.get("delta") or {}).get("content"):
                            times.append(now)
                            res.text += ch["delta"]["content"]
                    if drop_after and len(times) >= drop_after:
                        resp.close()                      # the client goes away mid-stream
                        res.end, res.dropped = time.perf_counter(), True
                        return res
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise HarnessError(f"request failed: {type(e).__name__}: {e}") from e
        res.end = time.perf_counter()
        if not times:
            raise HarnessError(f"a stream ended without any token (usage {res.usage})")
        if not res.usage or not res.usage.get("completion_tokens"):
            raise HarnessError("a stream ended without usage (stream_options.include_usage)")
        return res


def pct(xs, p):
    """Percentile with linear interpolation (numpy's default); None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p / 100
    f = int(k)
    return s[f] + (s[min(f + 1, len(s) - 1)] - s[f]) * (k - f)


def user(text):
    return [{"role": "user", "content": text}]


# --- workloads ---------------------------------------------------------------------------------

async def w_single(cl, corpus, sz):
    rs = []
    for i in range(sz.single_n):
        k = f"single-{i}"
        rs.append(await cl.chat(user(corpus.passage(sz.single_prompt, k) + "\n\nContinue this scene of Hamlet."),
                                sz.single_max, seed_of(k)))
    gaps = [g for r in rs for g in r.gaps()]
    decode = [(r.tokens - 1) / (r.times[-1] - r.times[0]) for r in rs if r.tokens > 1 and r.times[-1] > r.times[0]]
    return {
        "single.ttft_p50": pct([r.ttft for r in rs], 50) * 1e3,
        "single.itl_p50": pct(gaps, 50) * 1e3,
        "single.itl_p95": pct(gaps, 95) * 1e3,
        "single.itl_p99": pct(gaps, 99) * 1e3,
        "single.decode": statistics.median(decode) if decode else 0.0,
        "single.prompt_tokens": statistics.median(r.usage["prompt_tokens"] for r in rs),
        "single.out_tokens": statistics.mean(r.tokens for r in rs),
    }


async def w_levels(cl, corpus, sz):
    """N closed-loop clients per level. The clients start spread over the warm-up (no synchronized
    burst); throughput is counted inside the window [warm-up end, end]; at the end no request is
    sent any more, the requests in flight are kept until their first token (their TTFT counts)
    and then dropped. In a smoke run every client sends at least one request and every request
    runs to its end, however long the machine takes (within `smoke_wait`), so the figures never
    depend on the machine's speed."""
    out = {}
    for c in sz.levels:
        t0 = time.perf_counter()
        w0 = t0 + sz.level_warm
        w1 = w0 + sz.level_dur[c]
        rs = []

        async def worker(j, c=c):
            await asyncio.sleep(j * sz.level_warm / c)
            i = 0
            while time.perf_counter() < w1 or (sz.smoke and i == 0):
                k = f"c{c}-{j}-{i}"
                await cl.chat(user(corpus.passage(sz.level_prompt, k) + "\n\nContinue this scene of Hamlet."),
                              sz.level_max, seed_of(k), sink=rs.append)
                i += 1

        tasks = [asyncio.ensure_future(worker(j)) for j in range(c)]
        await asyncio.sleep(max(0.0, w1 - time.perf_counter()))
        if sz.smoke:
            # The workers stop sending at the window's end and return when their last request is done.
            done, pending = await asyncio.wait(tasks, timeout=sz.smoke_wait, return_when=asyncio.FIRST_EXCEPTION)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for t in done:
                t.result()                          # raises a failed request's error
            if pending:
                raise HarnessError(f"c={c}: {len(pending)} of {c} clients still had a request running "
                                   f"{sz.smoke_wait:.0f} s after the window closed")
        # Until every request in flight has its first token, and (on a machine where a request at
        # this concurrency outlasts the window) one request has finished: its usage scales chunks
        # to tokens. What runs past the window is not counted in it.
        while ((any(not r.times and not r.end for r in rs) or not any(r.usage for r in rs))
               and not any(t.done() and t.exception() for t in tasks)     # a failed request
               and time.perf_counter() < w1 + 120):
            await asyncio.sleep(0.01)
        for t in tasks:
            t.cancel()
        for d in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(d, Exception):
                raise d
        await asyncio.sleep(0.5)                    # let the server free the dropped slots
        finished = [r for r in rs if r.usage]
        if not finished:
            raise HarnessError(f"c={c}: no request finished in {time.perf_counter() - t0:.0f} s")
        if sz.smoke and len(finished) != len(rs):
            raise HarnessError(f"c={c}: {len(rs) - len(finished)} of {len(rs)} requests ended without usage")
        # Chunks are counted in the window and scaled to tokens by usage / chunks (a chunk is
        # almost always one token; a character split across tokens makes one chunk of two).
        per_chunk = sum(r.tokens for r in finished) / sum(len(r.times) for r in finished)
        in_window = sum(1 for r in rs for t in r.times if w0 <= t < w1)
        ttft = [r.ttft for r in rs if r.times and r.sent < w1]
        out[f"c{c}.tok_s"] = in_window * per_chunk / (w1 - w0)
        # Requests/s as output tok/s over the mean output of a finished request: at c=16 a request
        # lasts about as long as the window, so counting the requests that end inside it would
        # depend on where the window cuts the waves.
        out[f"c{c}.req_s"] = out[f"c{c}.tok_s"] / statistics.mean(r.tokens for r in finished)
        out[f"c{c}.ttft_p50"] = pct(ttft, 50) * 1e3
        out[f"c{c}.ttft_p99"] = pct(ttft, 99) * 1e3
        out[f"c{c}.out_tokens"] = statistics.mean(r.tokens for r in finished)
        log(f"  c={c}: {out[f'c{c}.tok_s']:.1f} tok/s, {len(rs)} requests ({len(ttft)} TTFTs), "
            f"{time.perf_counter() - t0:.1f} s")
    return out


async def w_shared(cl, corpus, sz):
    # A system prompt no other workload uses, so the first request finds nothing cached.
    system = ("You answer questions about the following passage of Hamlet.\n\n"
              + corpus.passage(sz.shared_prefix, "shared-system"))
    rs = []
    for i in range(sz.shared_n):
        q = corpus.passage(12, f"shared-q-{i}")
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": f"Who speaks the line \"{q.strip()}\"?"}]
        rs.append(await cl.chat(messages, sz.shared_max, seed_of(f"shared-{i}")))
    first, rest = rs[0].ttft, pct([r.ttft for r in rs[1:]], 50)
    cached = [(r.usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for r in rs[1:]]
    return {
        "shared.ttft_first": first * 1e3,
        "shared.ttft_rest": rest * 1e3,
        "shared.speedup": first / rest,
        "shared.prompt_tokens": rs[0].usage["prompt_tokens"],
        "shared.cached_rest": statistics.median(cached),
    }


def pairs_of(results):
    """(earlier, later) arrival times of consecutive tokens of each stream."""
    return [(t1, t2) for r in list(results) for t1, t2 in zip(r.times, r.times[1:])]


async def wait_for_event(cond, tasks, limit, what):
    """Smoke runs: polls `cond` up to `limit` seconds, failing at once if one of `tasks` failed."""
    deadline = time.perf_counter() + limit
    while not cond():
        for t in tasks:
            if t.done():
                t.result()
        if time.perf_counter() > deadline:
            raise HarnessError(f"no {what} within {limit:.0f} s")
        await asyncio.sleep(0.05)


async def w_long(cl, corpus, sz):
    """Short streams decode alone for a while, then a long prompt arrives; compares their token gaps.

    The short streams are long-lived (max_tokens covers the whole workload; one that stops at EOS is
    replaced), so the gaps measured are decode steps, not other short requests' prefills. Gaps
    entirely before the long request is sent are "alone"; gaps overlapping the interval from
    sending it to its first token (its prefill) are "during". The short streams are dropped once
    the long request has its first token.
    """
    results = []

    async def short(j):
        i = 0
        while True:                         # ends when cancelled
            k = f"long-short-{j}-{i}"
            await cl.chat(user(corpus.passage(sz.long_short_prompt, k) + "\n\nContinue this scene of Hamlet."),
                          sz.long_short_max, seed_of(k), sink=results.append)
            i += 1

    shorts = [asyncio.ensure_future(short(j)) for j in range(sz.long_clients)]
    try:
        # The short streams' own prefill: `long_lead` on a quiet machine; on a busy one (or with a
        # debug build) wait until each stream decodes, within a bound.
        await asyncio.sleep(sz.long_lead)
        deadline = time.perf_counter() + 60
        while sum(1 for r in results if len(r.times) >= 2) < sz.long_clients and time.perf_counter() < deadline:
            for t in shorts:
                if t.done():
                    t.result()
            await asyncio.sleep(0.05)
        w0 = time.perf_counter()
        await asyncio.sleep(sz.long_baseline)
        if sz.smoke:
            # However slow the machine: a gap between two short-stream tokens before the long prompt.
            await wait_for_event(lambda: any(t1 >= w0 for t1, _ in pairs_of(results)), shorts, sz.smoke_wait,
                                 "two short-stream tokens before the long prompt")
        for t in shorts:
            if t.done():
                t.result()                  # raises the short stream's failure
        lr = await cl.chat(user(corpus.passage(sz.long_prompt, "long-prompt") + "\n\nWhat happens in this passage?"),
                           4, seed_of("long-prompt"))
        if sz.smoke:
            # And a gap overlapping the long prompt's prefill (a short-stream token after its first).
            a, b = lr.sent, lr.times[0]
            await wait_for_event(lambda: any(t2 > a and t1 < b for t1, t2 in pairs_of(results)), shorts,
                                 sz.smoke_wait, "a short-stream token during or after the long prefill")
    finally:
        for t in shorts:
            t.cancel()                      # drops the connections: the servers cancel
        done = await asyncio.gather(*shorts, return_exceptions=True)
    for d in done:
        if not isinstance(d, asyncio.CancelledError):
            raise d if isinstance(d, BaseException) else HarnessError(f"short stream ended: {d}")
    await asyncio.sleep(0.5)                # let the servers free the dropped slots
    a, b = lr.sent, lr.times[0]             # the long prompt is being prefilled in [a, b]
    pairs = pairs_of(results)
    alone = [t2 - t1 for t1, t2 in pairs if t1 >= w0 and t2 <= a]
    during = [t2 - t1 for t1, t2 in pairs if t2 > a and t1 < b]
    if not alone or not during:
        raise HarnessError(f"too few short-stream tokens ({len(alone)} gaps alone, {len(during)} during the prefill)")
    p_alone, p_during = pct(alone, 99), pct(during, 99)
    return {
        "long.itl_p99_without": p_alone * 1e3,
        "long.itl_p99_during": p_during * 1e3,
        "long.itl_ratio": p_during / p_alone,
        "long.itl_max_during": max(during) * 1e3,
        "long.ttft": lr.ttft * 1e3,
        "long.prompt_tokens": lr.usage["prompt_tokens"],
    }


async def w_storm(cl, corpus, sz):
    async def probes(tag):
        rs = []
        for i in range(sz.probe_n):
            k = f"probe-{tag}-{i}"
            rs.append(await cl.chat(user(corpus.passage(sz.probe_prompt, k) + "\n\nContinue this scene of Hamlet."),
                                    sz.probe_max, seed_of(k)))
        return rs

    before = await probes("before")
    t0 = time.perf_counter()
    storm = await asyncio.gather(*(
        cl.chat(user(corpus.passage(sz.storm_prompt, f"storm-{i}") + "\n\nContinue this scene of Hamlet."),
                sz.storm_max, seed_of(f"storm-{i}"), drop_after=sz.storm_drop_after)
        for i in range(sz.storm_n)))
    storm_s = time.perf_counter() - t0
    after = await probes("after")
    tb = statistics.median(r.ttft for r in before)
    return {
        "storm.ttft_before": tb * 1e3,
        "storm.ttft_after": after[0].ttft * 1e3,
        "storm.ttft_after_p50": statistics.median(r.ttft for r in after) * 1e3,
        "storm.ratio": after[0].ttft / tb,
        "storm.seconds": storm_s,
        "storm.dropped": sum(r.dropped for r in storm),
    }


def grounded_prompt(corpus, sz, key):
    return user("Copy the following passage of Hamlet exactly, line by line, with no comment:\n\n"
                + corpus.passage(sz.grounded_prompt, key))


async def w_grounded(cl, corpus, sz):
    """Answers grounded in their input (what prompt-lookup speculation is for: edits, quotes,
    summaries that reuse the source's words): the model copies a passage it was given, greedy, one
    user after another and then `grounded_c` at once. Decode rates as in `single` and `levels`;
    llmr's draft counters give the share of draft tokens kept."""
    before = await cl.draft_counters()
    rs = []
    for i in range(sz.grounded_n):
        k = f"grounded-{i}"
        rs.append(await cl.chat(grounded_prompt(corpus, sz, k), sz.grounded_max, seed_of(k), temperature=0.0))
    decode = [(r.tokens - 1) / (r.times[-1] - r.times[0]) for r in rs if r.tokens > 1 and r.times[-1] > r.times[0]]
    many = await asyncio.gather(*[cl.chat(grounded_prompt(corpus, sz, f"grounded-c-{j}"), sz.grounded_max,
                                          seed_of(f"grounded-c-{j}"), temperature=0.0)
                                  for j in range(sz.grounded_c)])
    # From the last first token to the last token: every stream decoding (llama-batched-bench's
    # window); chunks scaled to tokens as in `levels`.
    w0, w1 = max(r.times[0] for r in many), max(r.times[-1] for r in many)
    per_chunk = sum(r.tokens for r in many) / sum(len(r.times) for r in many)
    together = sum(1 for r in many for t in r.times if t > w0)
    after = await cl.draft_counters()
    out = {
        "grounded.decode": statistics.median(decode) if decode else 0.0,
        "grounded.c_tok_s": together * per_chunk / (w1 - w0) if w1 > w0 else 0.0,
        "grounded.out_tokens": statistics.mean(r.tokens for r in rs + many),
    }
    if before is not None and after is not None and after[0] > before[0]:
        out["grounded.acceptance"] = (after[1] - before[1]) / (after[0] - before[0])
        out["grounded.drafted_per_token"] = (after[0] - before[0]) / sum(r.tokens for r in rs + many)
    return out


QUESTIONS = ["Who speaks first in this passage?", "What is the mood of the scene?", "Name one image the speaker uses.",
             "Which line matters most, and why?", "What happens just before this passage?", "Who is addressed?",
             "Summarise the passage in one sentence.", "What would an actor stress here?", "Give the passage a title."]


async def w_multiturn(cl, corpus, sz):
    """One chat of `turns` turns, greedy: the first message carries a passage, each later turn
    sends the whole conversation so far (with this server's own answers, as a chat client does)
    plus a short question. A server that keeps the conversation's cache reads only the new
    tokens; one that lost it (a sliding-window model without checkpoints) reads it all again."""
    messages = [{"role": "user", "content": "Read this passage of Hamlet and answer my questions briefly.\n\n"
                 + corpus.passage(sz.turn_passage, "multiturn")}]
    ttfts, prompt = [], 0
    for t in range(sz.turns):
        if t > 0:
            messages.append({"role": "user", "content": QUESTIONS[(t - 1) % len(QUESTIONS)]})
        r = await cl.chat(messages, sz.turn_max, seed_of(f"multiturn-{t}"), temperature=0.0)
        ttfts.append(r.ttft)
        prompt = r.usage["prompt_tokens"]
        messages.append({"role": "assistant", "content": r.text})
    return {
        "multiturn.ttft_first": ttfts[0] * 1e3,
        "multiturn.ttft_rest": statistics.median(ttfts[1:]) * 1e3,
        "multiturn.prompt_tokens_last": prompt,
    }


WORKLOADS = [("single", w_single), ("levels", w_levels), ("shared", w_shared), ("long", w_long), ("storm", w_storm),
             ("grounded", w_grounded), ("multiturn", w_multiturn)]


# --- servers -----------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def total_cells(slots, ctx):
    return min(slots * ctx, max(ctx, LLMR_MAX_TOTAL_CELLS))


def separate_streams(slots, ctx):
    return slots > 1 and slots * ctx <= max(ctx, LLMR_MAX_TOTAL_CELLS)


def server_command(kind, a, exe, model_path, alias, port):
    if kind == "llama-server":
        return [exe, "-m", str(model_path), "--host", "127.0.0.1", "--port", str(port), "-t", str(a.threads),
                "-c", str(total_cells(a.slots, a.ctx)), "-np", str(a.slots),
                "--no-kv-unified" if separate_streams(a.slots, a.ctx) else "--kv-unified", "-a", alias,
                # Verbosity 4 logs llama.cpp's own load report (its KV cache size, read by kv_cache_mib):
                # a few lines per request more, none per token.
                "-lv", "4"]
    isolation = ["--engine-isolation", "in-process"] if kind == "llmr-in-process" else []
    # llmr-no-spec is the same server; its client turns speculation off in every request.
    return [exe, "serve", "--host", "127.0.0.1", "--port", str(port), "--engines-dir", str(REPO / "engines"),
            "--threads", str(a.threads), "--slots", str(a.slots), "--ctx-size", str(a.ctx), "--cache-mib", "0",
            "--queue-limit", str(max(64, 2 * a.slots + a.storm_n)), "--model", f"{alias}={model_path}", *isolation]


def die_with_parent():
    """In the server's process: SIGTERM when this script dies, however it dies (Linux prctl)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)    # PR_SET_PDEATHSIG
    except OSError:
        pass


def cpu_jiffies(pid=None):
    """Busy jiffies of the whole machine, or utime+stime of one process and its descendants (llmr
    runs each model's engine in a worker process of its own: that is the server's CPU too)."""
    if pid is None:
        f = open("/proc/stat").readline().split()[1:]
        v = list(map(int, f))
        return sum(v) - v[3] - v[4]                 # minus idle and iowait
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                f = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue                            # gone meanwhile
            stats[int(entry)] = (int(f[1]), int(f[11]) + int(f[12]))     # ppid, utime + stime
    tree, total, grew = {pid}, 0, True
    while grew:
        grew = False
        for p, (ppid, _) in stats.items():
            if ppid in tree and p not in tree:
                tree.add(p)
                grew = True
    return sum(stats[p][1] for p in tree if p in stats)


def tree_rss_mib(pid):
    """Resident memory of a process and its descendants (llmr's engine workers), in MiB."""
    return tree_rss_kib(pid) / 1024


KV_SIZE = re.compile(r"llama_kv_cache: size = +([0-9.]+) MiB")


async def kv_cache_mib(kind, srv, session, engine):
    """The KV cache the server's llama.cpp allocated, as llama.cpp reported it: llama-server logs
    it (one line per cache: a sliding-window model has two), llmr serves it as
    `llmr_kv_cache_bytes` (its plugin reads the same report). The native engine allocates blocks
    as sequences fill them: its figure is its budget, the most its cache may hold."""
    if kind == "llama-server":
        sizes = [float(m) for m in KV_SIZE.findall(srv.log_path.read_text(errors="replace"))]
        return sum(sizes) if sizes else None
    async with session.get(f"http://127.0.0.1:{srv.port}/metrics") as r:
        text = await r.text()
    metric = "llmr_kv_cache_budget_bytes{" if engine == "native" else "llmr_kv_cache_bytes{"
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(metric)]
    return sum(values) / (1 << 20) if values else None


class Server:
    def __init__(self, kind, cmd, port, logdir):
        self.kind, self.cmd, self.port = kind, cmd, port
        self.log_path = Path(logdir) / f"{kind}-{port}.log"
        self.proc = None

    def start(self):
        self.started = time.perf_counter()
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=die_with_parent)

    def tail(self, n=25):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def check_alive(self):
        if self.proc.poll() is not None:
            raise HarnessError(f"{self.kind} exited with {self.proc.returncode}; its log ends:\n{self.tail()}")

    async def wait_ready(self, session, model, timeout):
        """Until a tiny request succeeds (llama-server answers 503 while loading)."""
        import aiohttp
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
        deadline = time.perf_counter() + timeout
        last = ""
        while time.perf_counter() < deadline:
            self.check_alive()
            try:
                async with session.post(f"http://127.0.0.1:{self.port}/v1/chat/completions", json=body,
                                        timeout=aiohttp.ClientTimeout(total=30)) as r:
                    if r.status == 200:
                        await r.read()
                        return time.perf_counter() - self.started
                    last = f"HTTP {r.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                last = type(e).__name__
            await asyncio.sleep(0.1)
        raise HarnessError(f"{self.kind} not ready after {timeout} s ({last}); its log ends:\n{self.tail()}")

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


async def run_server(kind, a, exe, model_path, alias, corpus, sz, logdir):
    """Starts one server, runs every workload against it, stops it. Returns the figures."""
    import aiohttp
    port = free_port()
    srv = Server(kind, server_command(kind, a, exe, model_path, alias, port), port, logdir)
    log(f"{alias}: starting {kind}: {' '.join(srv.cmd)}")
    srv.start()
    figures = {}
    # A new connection per request: llama-server (cpp-httplib) closes idle keep-alive connections after
    # 5 s and after 100 requests, and a reused connection closed under the client fails the request.
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=a.request_timeout, sock_read=60)
    try:
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            figures["startup_s"] = await srv.wait_ready(session, alias, 180)
            log(f"{alias}/{kind}: ready {figures['startup_s']:.1f} s after start")
            extra = {"speculative": False} if kind == "llmr-no-spec" else None
            cl = Client(session, f"http://127.0.0.1:{port}", alias, a.temperature, extra)
            for i in range(2):                                  # warm-up, not measured
                await cl.chat(user(corpus.passage(50, f"warm-{i}")), 8, seed_of(f"warm-{i}"))
            log(f"{alias}/{kind}: warmed up")
            hz = os.sysconf("SC_CLK_TCK")
            t0, busy0, srv0, me0 = time.perf_counter(), cpu_jiffies(), cpu_jiffies(srv.proc.pid), sum(os.times()[:2])
            for name, fn in WORKLOADS:
                if name not in a.workloads.split(","):
                    continue
                w0 = time.perf_counter()
                limit = min(a.workload_timeout, a.deadline - time.time())
                if limit <= 0:
                    raise HarnessError(f"the run is past its bound of {a.max_minutes} min (--max-minutes)")
                try:
                    got = await asyncio.wait_for(fn(cl, corpus, sz), limit)
                    figures.update(got)
                except asyncio.TimeoutError:
                    raise HarnessError(f"workload {name} ran past {limit:.0f} s (a loaded machine?)")
                except HarnessError as e:
                    srv.check_alive()
                    raise HarnessError(f"workload {name}: {e}") from e
                srv.check_alive()
                log(f"{alias}/{kind}: {name} done in {time.perf_counter() - w0:.1f} s: "
                    + ", ".join(f"{k.split('.', 1)[-1]} {fmt(v)}" for k, v in got.items() if isinstance(v, (int, float))))
            wall = time.perf_counter() - t0
            # CPU used by processes other than this server and this client while measuring, in cores:
            # a shared machine makes the numbers noise, and this says how much.
            other = (cpu_jiffies() - busy0 - (cpu_jiffies(srv.proc.pid) - srv0)) / hz - (sum(os.times()[:2]) - me0)
            figures["other_cpu"] = max(0.0, other / wall)
            figures["server_cpu"] = (cpu_jiffies(srv.proc.pid) - srv0) / hz / wall
            figures["measure_s"] = wall
            figures["requests"] = cl.requests
            figures["kv_cache_mib"] = await kv_cache_mib(kind, srv, session, a.engine)
            figures["rss_mib"] = tree_rss_mib(srv.proc.pid)
    finally:
        srv.stop()
    return figures


# --- report ------------------------------------------------------------------------------------

HIGHER, LOWER, INFO = "higher", "lower", ""


def rows(levels):
    r = [("single user: TTFT p50 (ms)", "single.ttft_p50", LOWER),
         ("single user: inter-token p50 (ms)", "single.itl_p50", LOWER),
         ("single user: inter-token p95 (ms)", "single.itl_p95", LOWER),
         ("single user: inter-token p99 (ms)", "single.itl_p99", LOWER),
         ("single user: decode (tok/s)", "single.decode", HIGHER)]
    for c in levels:
        r += [(f"c={c}: output (tok/s)", f"c{c}.tok_s", HIGHER),
              (f"c={c}: requests/s", f"c{c}.req_s", HIGHER),
              (f"c={c}: TTFT p50 (ms)", f"c{c}.ttft_p50", LOWER),
              (f"c={c}: TTFT p99 (ms)", f"c{c}.ttft_p99", LOWER)]
    r += [("shared prefix: TTFT first (ms)", "shared.ttft_first", LOWER),
          ("shared prefix: TTFT rest p50 (ms)", "shared.ttft_rest", LOWER),
          ("shared prefix: first / rest (x)", "shared.speedup", HIGHER),
          ("long prompt: short-stream inter-token p99 alone (ms)", "long.itl_p99_without", LOWER),
          ("long prompt: same, during the long prefill (ms)", "long.itl_p99_during", LOWER),
          ("long prompt: during / alone (x)", "long.itl_ratio", LOWER),
          ("long prompt: its TTFT (ms)", "long.ttft", LOWER),
          ("cancel storm: TTFT before (ms)", "storm.ttft_before", LOWER),
          ("cancel storm: TTFT right after (ms)", "storm.ttft_after", LOWER),
          ("cancel storm: after / before (x)", "storm.ratio", LOWER),
          ("cancel storm: storm duration (s)", "storm.seconds", LOWER),
          ("input-grounded, greedy: single-user decode (tok/s)", "grounded.decode", HIGHER),
          ("input-grounded, greedy: decode at c=8 (tok/s)", "grounded.c_tok_s", HIGHER),
          ("multi-turn chat: TTFT turn 1 (ms)", "multiturn.ttft_first", LOWER),
          ("multi-turn chat: TTFT turns 2-10 p50 (ms)", "multiturn.ttft_rest", LOWER),
          ("info: multi-turn chat: prompt tokens of the last turn", "multiturn.prompt_tokens_last", INFO),
          ("info: input-grounded draft tokens kept / fed", "grounded.acceptance", INFO),
          ("info: input-grounded draft tokens fed per output token", "grounded.drafted_per_token", INFO),
          ("memory: KV cache allocated (llama.cpp: as it reports it; native engine: its budget) (MiB)", "kv_cache_mib",
           LOWER),
          ("memory: resident after the workloads (MiB)", "rss_mib", LOWER),
          ("info: start to first answer (s)", "startup_s", LOWER),
          ("info: prompt tokens single / shared / long", ("single.prompt_tokens", "shared.prompt_tokens",
                                                            "long.prompt_tokens"), INFO),
          ("info: shared prefix cached tokens, rest p50", "shared.cached_rest", INFO),
          ("info: mean output tokens/request single / c=max", ("single.out_tokens", f"c{levels[-1]}.out_tokens"),
           INFO),
          ("info: server CPU while measuring (cores)", "server_cpu", INFO),
          ("info: other processes' CPU while measuring (cores)", "other_cpu", INFO)]
    return r


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, tuple):
        return " / ".join(fmt(x) for x in v)
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def get(fig, key):
    if isinstance(key, tuple):
        return tuple(fig.get(k) for k in key)
    return fig.get(key)


def table(ref, ours, levels, ref_name="llama-server"):
    out = [f"| figure | {ref_name} | llmr | llmr / {ref_name} | better |", "|---|---:|---:|---:|---|"]
    absent = lambda v: v is None or (isinstance(v, tuple) and all(x is None for x in v))
    for label, key, better in rows(levels):
        rv, ov = get(ref, key), get(ours, key)
        if absent(rv) and absent(ov):
            continue                                # a workload this run left out (--workloads)
        ratio = "-" if better == INFO or not rv or not ov else f"{ov / rv:.2f}"
        out.append(f"| {label} | {fmt(rv)} | {fmt(ov)} | {ratio} | {better} |")
    return "\n".join(out)


def goals(ref, ours, levels, ref_name="llama-server"):
    """The goals each comparison has; a figure a run did not produce (`--workloads`) is left out."""
    g = []

    def add(name, target, value, ok, refv=None):
        g.append(f"| {name} | {target} | {fmt(value)} | {fmt(refv)} | {'yes' if ok else '**no**'} |")

    def ratio(name, key, target, ok):
        if ours.get(key) and ref.get(key):
            v = ours[key] / ref[key]
            add(name, target, v, ok(v))

    def own(name, key, target, ok):
        if key in ours:
            add(name, target, ours[key], ok(ours[key]), ref.get(key))

    def done(ref_label):
        return "\n".join([f"| goal | target | llmr | {ref_label} | met |", "|---|---|---:|---:|---|"] + g)

    at_least = lambda x: lambda v: v >= x        # noqa: E731
    at_most = lambda x: lambda v: v <= x         # noqa: E731
    big = [c for c in (8, 16) if c in levels]
    if ref_name == "llmr-no-spec":
        # Issue 17: speculation pays where answers reuse their input, and costs nothing elsewhere.
        ratio("single-user decode tok/s (free text), with / without speculation", "single.decode", ">= 0.97",
              at_least(0.97))
        for c in big:
            ratio(f"aggregate tok/s at c={c} (free text), with / without", f"c{c}.tok_s", ">= 0.97", at_least(0.97))
        ratio("input-grounded single-user decode, with / without", "grounded.decode", "> 1", lambda v: v > 1)
        ratio("input-grounded decode at c=8, with / without", "grounded.c_tok_s", ">= 1", at_least(1))
        return done(ref_name)
    if ref_name == "llmr-in-process":
        # Issue 16: engine worker processes cost at most 3% of decode speed and TTFT.
        ratio("single-user decode tok/s, worker / in process", "single.decode", ">= 0.97", at_least(0.97))
        ratio("single-user TTFT p50, worker / in process", "single.ttft_p50", "<= 1.03", at_most(1.03))
        for c in big:
            ratio(f"aggregate tok/s at c={c}, worker / in process", f"c{c}.tok_s", ">= 0.97", at_least(0.97))
        return done(ref_name)
    for c in big:
        ratio(f"aggregate tok/s at c={c}, llmr / llama-server", f"c{c}.tok_s", ">= 1.15", at_least(1.15))
    ratio("single-user TTFT p50, llmr / llama-server", "single.ttft_p50", "<= 1.0", at_most(1.0))
    own("shared 1,000-token prefix: TTFT first / rest", "shared.speedup", ">= 5", at_least(5))
    own("inter-token p99 during a long prefill / without", "long.itl_ratio", "<= 1.5", at_most(1.5))
    ratio("input-grounded single-user decode, llmr / llama-server", "grounded.decode", "report", lambda v: v > 1)
    ratio("input-grounded decode at c=8, llmr / llama-server", "grounded.c_tok_s", "report", lambda v: v > 1)
    ratio("multi-turn chat: TTFT turns 2-10, llmr / llama-server", "multiturn.ttft_rest", "<= 0.5", at_most(0.5))
    return done("llama-server")


# --- smoke check ---------------------------------------------------------------------------------

# Figures only a server that speculates has, and only when it drafted something.
OPTIONAL_FIGURES = {"grounded.acceptance", "grounded.drafted_per_token"}


def smoke_failures(results, failures, names, servers, workloads, levels):
    """What a smoke run must have produced: figures from every server and workload asked for, each a
    finite number (speed is not judged), and a cancel storm that really dropped streams."""
    out = []
    for name in names:
        for kind in servers:
            fig = results.get((name, kind))
            if fig is None:
                if not any(f.startswith(f"{name} / {kind}:") for f in failures):
                    out.append(f"{name} / {kind}: no figures")
                continue
            keys = []
            for _, key, _ in rows(levels):
                keys += list(key) if isinstance(key, tuple) else [key]
            for key in keys:
                workload = key.split(".", 1)[0] if "." in key else None
                if workload and workload.startswith("c") and workload[1:].isdigit():
                    workload = "levels"
                if (workload and workload not in workloads) or key in OPTIONAL_FIGURES:
                    continue
                v = fig.get(key)
                if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    out.append(f"{name} / {kind}: figure {key} is {v!r}")
            if "storm" in workloads and not fig.get("storm.dropped"):
                out.append(f"{name} / {kind}: no stream of the cancel storm was dropped (the cancel path did not run)")
    return out


# --- main --------------------------------------------------------------------------------------

def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def load1():
    return os.getloadavg()[0]


def busy_cores(seconds=3.0):
    """Cores the machine kept busy over `seconds` (call it while nothing of ours runs)."""
    b0, t0 = cpu_jiffies(), time.perf_counter()
    time.sleep(seconds)
    return (cpu_jiffies() - b0) / os.sysconf("SC_CLK_TCK") / (time.perf_counter() - t0)


def wait_idle(until, threshold=0.25):
    """Before each server: waits (until the time `until`) for other processes to leave the cores."""
    busy = busy_cores()
    while busy >= threshold and time.time() < until:
        log(f"other processes keep {busy:.2f} cores busy: waiting ({until - time.time():.0f} s left)")
        time.sleep(20)
        busy = busy_cores()
    return busy


def wait_quiet(limit_s, threshold=1.0):
    """Waits (up to limit_s) for the 1-minute load average to fall below threshold."""
    deadline = time.time() + limit_s
    while load1() >= threshold and time.time() < deadline:
        log(f"load average {load1():.2f} >= {threshold}: waiting for a quiet machine "
            f"({deadline - time.time():.0f} s left)")
        time.sleep(30)
    return load1()


def quiet_wait(a, load=False):
    """Spends what is left of the --wait-quiet budget waiting for a quiet machine (the load average
    first with load=True, then other processes' CPU); the wait does not count in --max-minutes."""
    t = time.time()
    if load:
        r = wait_quiet(a.quiet_left) if a.quiet_left > 0 else load1()
    else:
        r = wait_idle(t + a.quiet_left) if a.quiet_left > 0 else None
    waited = time.time() - t
    a.quiet_left = max(0.0, a.quiet_left - waited)
    a.deadline += waited
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=None, help="comma-separated: smollm2,gemma3 (smoke: smollm2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=16, help="parallel slots of both servers")
    ap.add_argument("--ctx", type=int, default=4096, help="context per slot (llama-server -c gets the same total)")
    ap.add_argument("--temperature", type=float, default=0.8, help="every request also carries a fixed seed")
    ap.add_argument("--smoke", action="store_true", help="a few requests per workload: checks the harness, not speed")
    ap.add_argument("--write", action="store_true", help="append the tables to bench/RESULTS.md")
    ap.add_argument("--wait-quiet", type=float, default=None,
                    help="seconds to wait for load average < 1.0 before measuring (default 600, smoke 0)")
    ap.add_argument("--no-build", action="store_true", help="skip cargo build / install-engines / fetch-models")
    ap.add_argument("--llmr-bin", default=None,
                    help="the llmr binary (default: the release build, built first); scripts/test passes its debug build")
    ap.add_argument("--reference", default="llama-server", choices=["llama-server", "llmr-in-process", "llmr-no-spec"],
                    help="what llmr (plugins in engine worker processes) is compared with: llama-server, llmr "
                         "with its plugins in its own process (--engine-isolation in-process), or llmr with "
                         "speculative decoding off in every request (`speculative: false`)")
    ap.add_argument("--engine", default="llama_cpp", choices=["llama_cpp", "native"],
                    help="llmr's engine: llama_cpp (both servers on the quantized GGUF) or native (llmr on the "
                         "Hugging Face folder, llama-server on the F16 GGUF of the same values)")
    ap.add_argument("--servers", default=None, help="for development: run only some servers")
    ap.add_argument("--workloads", default=",".join(n for n, _ in WORKLOADS),
                    help="for development: run only some workloads (their figures are logged)")
    ap.add_argument("--retries", type=int, default=None,
                    help="measure a server again when other processes used >= 0.25 cores meanwhile "
                    "(default 2, smoke 0)")
    ap.add_argument("--request-timeout", type=float, default=300)
    ap.add_argument("--workload-timeout", type=float, default=300)
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="bound of the whole run after the builds, quiet wait excluded (default 30, smoke too: a "
                    "smoke run takes a few minutes here and must pass on a machine several times slower)")
    a = ap.parse_args()
    a.models = a.models or ("smollm2" if a.smoke else "smollm2,gemma3")
    if a.retries is None:
        a.retries = 0 if a.smoke else 2
    if a.wait_quiet is None:
        a.wait_quiet = 0 if a.smoke else 600
    sz = SMOKE if a.smoke else Sizes()
    a.storm_n = sz.storm_n
    names = a.models.split(",")
    for n in names:
        if n not in MODELS:
            die(f"unknown model {n} (known: {', '.join(MODELS)})")
    # What each server loads: the fetch-models name of the reference's file and of llmr's (llmr
    # as the reference loads what llmr does).
    files = {n: NATIVE_MODELS[n] if a.engine == "native" else (n, n) for n in names}
    if a.reference != "llama-server":
        files = {n: (ours, ours) for n, (_, ours) in files.items()}
    fetch = sorted({f for pair in files.values() for f in pair})
    if max(sz.levels) > a.slots:
        die(f"--slots {a.slots} is below the highest concurrency {max(sz.levels)}")

    started = time.perf_counter()
    if not a.no_build and not a.llmr_bin:
        log("building llmr (release) and installing the engine plugins")
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "llmr", "-p", "llmr-llama-cpp"], check=True,
                       cwd=REPO)
        subprocess.run([REPO / "scripts/install-engines"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        fetched = sh([str(REPO / "scripts/fetch-models"), *fetch, "shakespeare"])
    elif not a.no_build:
        fetched = sh([str(REPO / "scripts/fetch-models"), *fetch, "shakespeare"])
    else:
        fetched = ""
    paths = dict(l.split("\t", 1) for l in fetched.splitlines() if "\t" in l)
    cache = Path(os.environ.get("LLMR_MODEL_CACHE", Path.home() / ".cache/llmr/models"))
    corpus = Corpus(paths.get("shakespeare", cache / "corpus/hamlet_gut.txt"))
    log("building (or finding) the reference llama-server")
    ref = dict(l.split("=", 1) for l in sh([str(REPO / "bench/reference/build.sh")]).splitlines() if "=" in l)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    exes = {"llama-server": ref["llama-server"], "llmr": a.llmr_bin or str(target / "release/llmr")}
    exes["llmr-in-process"] = exes["llmr-no-spec"] = exes["llmr"]
    a.servers = a.servers or f"{a.reference},llmr"
    for k, v in exes.items():
        if not Path(v).is_file():
            die(f"{k} binary not found at {v}")

    a.max_minutes = a.max_minutes or 30
    a.deadline = time.time() + a.max_minutes * 60
    a.quiet_left = a.wait_quiet
    load_before = quiet_wait(a, load=True)
    results, failures = {}, []
    with tempfile.TemporaryDirectory(prefix="llmr-serve-bench-") as logdir:
        for mi, name in enumerate(names):
            model_paths = {kind: Path(paths[f]) if f in paths else cache / CACHED[f]
                           for kind, f in zip([a.reference, "llmr"], files[name])}
            for kind, f in zip([a.reference, "llmr"], files[name]):
                if not model_paths[kind].exists():
                    die(f"{model_paths[kind]} is missing: run scripts/fetch-models {f}")
            # Alternate which server goes first, so slow drift of a shared machine hits both.
            order = [a.reference, "llmr"] if mi % 2 == 0 else ["llmr", a.reference]
            for kind in [k for k in order if k in a.servers.split(",")]:
                quiet_wait(a)
                for attempt in range(a.retries + 1):
                    t = time.time()
                    try:
                        fig = asyncio.run(run_server(kind, a, exes[kind], model_paths[kind], name, corpus, sz, logdir))
                    except HarnessError as e:
                        failures.append(f"{name} / {kind}: {e}")
                        log(f"FAILED {name} / {kind}: {e}")
                        break
                    results[(name, kind)] = fig
                    took = time.time() - t
                    if fig["other_cpu"] < 0.25 or attempt == a.retries or a.deadline - time.time() < 1.5 * took:
                        break
                    log(f"{name} / {kind}: other processes used {fig['other_cpu']:.2f} cores while measuring: "
                        f"measuring again (retry {attempt + 1} of {a.retries})")
                    quiet_wait(a)
    if a.smoke:
        failures += smoke_failures(results, failures, names, [k for k in a.servers.split(",")],
                                   a.workloads.split(","), sz.levels)
    load_after = load1()
    other_max = max((f["other_cpu"] for f in results.values()), default=0.0)
    quiet = load_before < 1.0 and other_max < 0.25

    commit = sh(["git", "rev-parse", "--short", "HEAD"], cwd=REPO).strip()
    dirty = " (with uncommitted changes)" if sh(["git", "status", "--porcelain", "--untracked-files=no"],
                                                 cwd=REPO).strip() else ""
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.machine())
    cmd = "bench/serve_bench.py" + "".join(f" {x}" for x in sys.argv[1:])
    elapsed = time.perf_counter() - started
    separate = separate_streams(a.slots, a.ctx)
    parts = [f"\n### {datetime.date.today()} · commit {commit}{dirty} · {cpu}, {os.cpu_count()} cores\n",
             f"Command: `{cmd}` ({elapsed / 60:.1f} min). Reference: "
             + {"llama-server": f"llama-server {ref.get('version', '?')} (bench/reference/build.sh)",
                "llmr-in-process": "the same llmr with its plugins in its own process (`--engine-isolation in-process`)",
                "llmr-no-spec": "the same llmr with speculative decoding off in every request (`speculative: false`)",
                }[a.reference]
             + f"; llmr: release build of this commit, each model in an engine worker process"
             + (", served by the native engine from the Hugging Face folder (bf16 safetensors)"
                + ("; llama-server gets the F16 GGUF holding the same values" if a.reference == "llama-server" else "")
                + ". " if a.engine == "native" else ". ")
             + 
             f"Both servers: {a.threads} threads, "
             f"{a.slots} slots, {total_cells(a.slots, a.ctx)} KV cells "
             f"{'in a stream per slot' if separate else 'in one unified cache'} "
             f"(llmr `--slots {a.slots} --ctx-size {a.ctx} --cache-mib 0`, llama-server "
             f"`-np {a.slots} -c {total_cells(a.slots, a.ctx)} {'--no-kv-unified' if separate else '--kv-unified'}`), "
             f"127.0.0.1, run one after the other; "
             f"streamed chat requests, temperature {a.temperature} with a fixed seed per request. "
             f"Load average before: {load_before:.2f}, after: {load_after:.2f}; CPU of other processes while "
             f"measuring: at most {other_max:.2f} cores"
             + ("" if quiet or a.smoke else " — **the machine was not quiet: these numbers are noisy**") + ".\n"]
    for name in names:
        r, o = results.get((name, a.reference)), results.get((name, "llmr"))
        if r and o:
            ref_file, our_file = (CACHED[f] for f in files[name])
            label = our_file if ref_file == our_file else f"{our_file} ({a.reference}: {ref_file})"
            parts.append(f"\n**{label}**\n\n{table(r, o, sz.levels, a.reference)}\n\n"
                         f"Goals:\n\n{goals(r, o, sz.levels, a.reference)}\n")
    if failures:
        parts.append("\nFailures:\n" + "\n".join(f"- {f}" for f in failures) + "\n")
    report = "".join(parts)
    print(report)
    log(f"total {elapsed:.0f} s")
    if failures:
        sys.exit(1)
    if a.write and not a.smoke:
        with open(REPO / "bench/RESULTS.md", "a") as f:
            f.write(report)
        log("appended to bench/RESULTS.md")


if __name__ == "__main__":
    ensure_venv()
    import signal
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # stop the servers on SIGTERM too
    main()
