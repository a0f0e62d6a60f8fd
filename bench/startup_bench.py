#!/usr/bin/env python3
"""Time from starting the server process to the first streamed token, llmr serve vs llama-server.

Each round starts a fresh server (llmr serve, then llama-server built from the same vendored
llama.cpp source, alternating), sends one streamed chat request as soon as the port accepts
connections (retrying 503 "loading" answers and refused connections), and records the time from
process start to the first content token. The server is stopped after each round. Medians and
the ratio llmr / llama-server are reported.

  bench/startup_bench.py [--model smollm2] [--rounds 5] [--threads 2] [--write]

--write appends the table to bench/RESULTS.md with the date, commit, machine and command.
"""
import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = {
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_token_seconds(cmd, port, model_name, timeout=60.0):
    """Starts `cmd`, streams one chat request, returns seconds from spawn to the first token."""
    body = json.dumps({
        "model": model_name,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
    }).encode()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - started < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}")
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    for raw in resp:
                        line = raw.decode().strip()
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        delta = json.loads(line[6:])["choices"]
                        if delta and delta[0]["delta"].get("content"):
                            return time.perf_counter() - started
                raise RuntimeError("stream ended without a token")
            except urllib.error.HTTPError as e:
                if e.code != 503:
                    raise
            except (ConnectionError, urllib.error.URLError):
                pass
            time.sleep(0.005)
        raise RuntimeError("timed out")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def reference_server():
    out = subprocess.run([REPO / "bench/reference/build.sh"], check=True, capture_output=True, text=True).stdout
    kv = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return kv["llama-server"], kv.get("version", "?")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2", choices=MODELS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()

    cache = Path(os.environ.get("LLMR_MODEL_CACHE", Path.home() / ".cache/llmr/models"))
    model = cache / MODELS[args.model]
    if not model.is_file():
        sys.exit(f"{model} is missing: run scripts/fetch-models {args.model}")
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "llmr"], check=True, cwd=REPO)
    subprocess.run([REPO / "scripts/install-engines"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    llmr = target / "release/llmr"
    server, version = reference_server()

    ours, ref = [], []
    for i in range(args.rounds):
        port = free_port()
        ref.append(first_token_seconds(
            [server, "-m", str(model), "--port", str(port), "-t", str(args.threads), "-c", "32768", "-np", "4", "--kv-unified",
             "--host", "127.0.0.1"], port, args.model))
        port = free_port()
        ours.append(first_token_seconds(
            [str(llmr), "serve", "--port", str(port), "--engines-dir", str(REPO / "engines"), "--threads",
             str(args.threads), "--model", f"{args.model}={model}"], port, args.model))
        print(f"round {i + 1}: llmr {ours[-1]:.3f} s, llama-server {ref[-1]:.3f} s", file=sys.stderr)

    mo, mr = statistics.median(ours), statistics.median(ref)
    table = (
        "| model | llmr serve (s) | llama-server (s) | ratio llmr/ref |\n"
        "|---|---:|---:|---:|\n"
        f"| {args.model} | {mo:.3f} | {mr:.3f} | {mo / mr:.2f} |\n"
    )
    print(table)
    if args.write:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
        with open(REPO / "bench/RESULTS.md", "a") as f:
            f.write(
                f"\n## Start to first streamed token ({datetime.date.today()}, commit {commit})\n\n"
                f"`bench/startup_bench.py --model {args.model} --rounds {args.rounds} --threads {args.threads}` on "
                f"{platform.machine()} {os.cpu_count()} cores; reference llama-server {version} with `-c 32768 -np 4 --kv-unified` "
                f"(the same KV cells and slots as llmr's defaults: 4 slots of 8192, unified). Time from spawning the server process to the first "
                f"content token of a streamed chat request (max_tokens 4) sent as soon as the port accepts; "
                f"medians of {args.rounds} fresh starts each, alternating.\n\n" + table)


if __name__ == "__main__":
    main()
