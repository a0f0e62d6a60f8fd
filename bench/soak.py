#!/usr/bin/env python3
"""The soak test of issue 16: `llmr serve` under steady load for a long time.

Starts the release `llmr serve` (each model in an engine worker process, as by default) with
SmolLM2 on 127.0.0.1, drives it with N closed-loop clients (chat completions, 64 tokens, fixed
seeds, temperature 0.8) for --minutes, and every 10 seconds records the resident memory of the
server and all its processes (workers included) and the latency of the requests that finished.
It reports per window of --window minutes: requests, failures, latency p50/p99 and RSS; and at
the end RSS growth after the warm-up (goal < 5%), p99 of the last window against the first after
warm-up (stable: goal <= 1.5), and failed requests (goal 0). Exit status 1 when a goal is missed.

  bench/soak.py [--minutes 30] [--clients 4] [--warmup 2] [--write]

Standard library only. --write appends the report to bench/RESULTS.md.
"""
import argparse
import datetime
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROMPTS = ["Write a short poem about the sea.", "Explain what a CPU cache is.", "List three uses of copper.",
           "What is the capital of Japan? Answer in one sentence.", "Give two tips for learning to cook."]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_rss_kib(pid):
    """VmRSS of `pid` and every descendant, in KiB."""
    parents, rss = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = open(f"/proc/{entry}/status").read()
        except OSError:
            continue
        fields = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
        parents[int(entry)] = int(fields.get("PPid", "0").strip())
        rss[int(entry)] = int(fields.get("VmRSS", "0 kB").split()[0]) if "VmRSS" in fields else 0
    tree, grew = {pid}, True
    while grew:
        grew = False
        for p, pp in parents.items():
            if pp in tree and p not in tree:
                tree.add(p)
                grew = True
    return sum(rss.get(p, 0) for p in tree)


def percentile(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def client(port, stop, results, lock, index):
    n = 0
    while not stop.is_set():
        body = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": PROMPTS[n % len(PROMPTS)]}],
                           "max_tokens": 64, "temperature": 0.8, "seed": index * 100000 + n})
        n += 1
        started = time.perf_counter()
        ok = False
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            ok = resp.status == 200 and json.loads(data)["choices"][0]["message"]["content"] is not None
            conn.close()
        except Exception:       # a failed request is counted, never fatal
            ok = False
        with lock:
            results.append((time.time(), time.perf_counter() - started, ok))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--warmup", type=float, default=2, help="minutes left out of the RSS baseline and p99 check")
    ap.add_argument("--window", type=float, default=5, help="minutes per row of the report")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llmr-bin", default=None)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    exe = a.llmr_bin or str(target / "release/llmr")
    model = subprocess.run([str(REPO / "scripts/fetch-models"), "smollm2"], check=True, capture_output=True,
                           text=True).stdout.strip().split("\t")[-1]
    port = free_port()
    log = open("/tmp/llmr-soak.log", "wb")
    server = subprocess.Popen([exe, "serve", "--host", "127.0.0.1", "--port", str(port), "--engines-dir",
                               str(REPO / "engines"), "--threads", str(a.threads), "--slots", str(a.clients),
                               "--cache-mib", "0", "--model", f"smollm2={model}"],
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/v1/models")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or server.poll() is not None:
                sys.exit("llmr serve did not start; see /tmp/llmr-soak.log")
            time.sleep(0.5)
        results, lock, stop = [], threading.Lock(), threading.Event()
        threads = [threading.Thread(target=client, args=(port, stop, results, lock, i), daemon=True)
                   for i in range(a.clients)]
        start = time.time()
        for t in threads:
            t.start()
        samples = []                          # (time, rss KiB)
        while time.time() - start < a.minutes * 60:
            time.sleep(10)
            if server.poll() is not None:
                sys.exit(f"llmr serve exited with {server.returncode} during the soak; see /tmp/llmr-soak.log")
            samples.append((time.time(), tree_rss_kib(server.pid)))
            print(f"[soak] {(time.time() - start) / 60:5.1f} min: {len(results)} requests, "
                  f"{sum(1 for r in results if not r[2])} failed, RSS {samples[-1][1] / 1024:.0f} MiB", flush=True)
        stop.set()
        for t in threads:
            t.join(timeout=130)
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()

    rows = ["| window (min) | requests | failed | latency p50 (s) | p99 (s) | RSS at end (MiB) |",
            "|---|---:|---:|---:|---:|---:|"]
    window_s = a.window * 60
    p99s = []
    t = start
    while t < start + a.minutes * 60 - 1:
        rs = [r for r in results if t <= r[0] < t + window_s]
        lat = [r[1] for r in rs if r[2]]
        rss = [s[1] for s in samples if s[0] < t + window_s]
        p99 = percentile(lat, 0.99)
        if t >= start + a.warmup * 60:
            p99s.append(p99)
        rows.append(f"| {(t - start) / 60:g}-{(t + window_s - start) / 60:g} | {len(rs)} | "
                    f"{sum(1 for r in rs if not r[2])} | {percentile(lat, 0.5):.2f} | {p99:.2f} | "
                    f"{(rss[-1] if rss else 0) / 1024:.0f} |")
        t += window_s
    after = [s[1] for s in samples if s[0] >= start + a.warmup * 60]
    growth = (after[-1] - after[0]) / after[0] * 100 if len(after) >= 2 else float("nan")
    failed = sum(1 for r in results if not r[2])
    p99_ratio = p99s[-1] / p99s[0] if len(p99s) >= 2 and p99s[0] > 0 else float("nan")
    goals = [("RSS growth after warm-up (%)", "< 5", growth, growth < 5),
             ("p99 latency, last window / first after warm-up", "<= 1.5", p99_ratio, p99_ratio <= 1.5),
             ("failed requests", "0", failed, failed == 0)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.machine())
    report = (f"\n### {datetime.date.today()} · commit {commit} · {cpu}, {os.cpu_count()} cores · soak\n\n"
              f"Command: `bench/soak.py" + "".join(f" {x}" for x in sys.argv[1:]) + "`: release `llmr serve`, "
              f"SmolLM2-135M Q4_1 in an engine worker, {a.clients} closed-loop clients, {a.threads} threads, "
              f"{len(results)} requests in {a.minutes:g} min; RSS of the server and its workers.\n\n"
              + "\n".join(rows) + "\n\n| goal | target | measured | met |\n|---|---|---:|---|\n"
              + "\n".join(f"| {n} | {t} | {v:.2f} | {'yes' if ok else '**no**'} |" for n, t, v, ok in goals) + "\n")
    print(report)
    if a.write:
        with open(REPO / "bench/RESULTS.md", "a") as f:
            f.write(report)
    sys.exit(0 if all(ok for *_, ok in goals) else 1)


if __name__ == "__main__":
    main()
