#!/usr/bin/env python3
"""The KV slow loop under a quality budget: how well it keeps a calibrated model inside the budget
while the cache is full, and what memory it saves, for one or more `llmr` builds side by side.

Each build in turn serves one native (safetensors) model with a calibration table
(`kv-eval --calibrate` wrote `.llmr-kv-calibration.json` into its folder) under the dynamic KV
policy, with `--slots` sequences of `--ctx-size` tokens. A run context sets the quality budget
(`POST /v1/run-context`), then `--clients` clients send long prompts from Hamlet (different
passages, the same for every build) back to back for `--seconds`, while the control API's
`/v1/metrics` is read every 200 ms. Reported per build and round:
- over budget: the share of readings, among those taken while requests were in flight, whose
  `delta_ppl_est` was above the budget;
- estimate: its mean over those readings;
- KV use: the mean of kv_bytes / kv_budget_bytes over the same readings (the pressure the
  policy answers to; lower holds more);
- the slow loop's changes: profile switches and threshold steps (`kv_threshold_refits_total`,
  absent from builds before the re-fit);
- tok/s: completion tokens of the requests that ended, over the run's length.

  bench/slow_loop_bench.py --model ~/.cache/llmr/models/smollm2-hf --budget 0.15 \
      --build before=/tmp/tgt-before/release/llmr --build after=target/release/llmr

Uses the bench venv (bench/serve_bench.py creates it). Builds are alternated over `--rounds`.
"""
import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True                 # no __pycache__ in the working tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_bench as sb  # noqa: E402

CALIBRATION = ".llmr-kv-calibration.json"


async def run_build(label, exe, a, corpus, logdir, rnd):
    import aiohttp
    port, control = sb.free_port(), sb.free_port()
    cmd = [exe, "serve", "--host", "127.0.0.1", "--port", str(port), "--engines-dir", str(sb.REPO / "engines"),
           "--threads", str(a.threads), "--slots", str(a.slots), "--ctx-size", str(a.ctx), "--cache-mib", "0",
           "--control-port", str(control), "--kv-policy", json.dumps({"mode": "dynamic", "profile": a.profile}),
           "--model", f"m={a.model}"]
    srv = sb.Server(f"{label}-r{rnd}", cmd, port, logdir)
    srv.start()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as s:
            await srv.wait_ready(s, "m", 300)
            ctl = f"http://127.0.0.1:{control}"
            body = {"seq_len": a.ctx, "batch": a.slots, "quality_budget": a.budget}
            async with s.post(f"{ctl}/v1/run-context", json=body) as r:
                if r.status != 204:
                    raise sb.HarnessError(f"run-context: HTTP {r.status}: {await r.text()}")
            cl = sb.Client(s, f"http://127.0.0.1:{port}", "m", 0.8)
            start = time.perf_counter()
            until = start + a.seconds
            done, in_flight = [], [0]

            async def client(j):
                i = 0
                while time.perf_counter() < until:
                    key = f"slow-loop-{j}-{i}"
                    prompt = sb.user(corpus.passage(a.prompt_tokens, key))
                    in_flight[0] += 1
                    try:
                        done.append(await cl.chat(prompt, a.max_tokens, sb.seed_of(key)))
                    finally:
                        in_flight[0] -= 1
                    i += 1

            readings = []

            async def sample():
                while time.perf_counter() < until:
                    busy = in_flight[0] > 0
                    async with s.get(f"{ctl}/v1/metrics") as r:
                        m = await r.json()
                    readings.append((busy and in_flight[0] > 0, m))
                    await asyncio.sleep(0.2)

            await asyncio.gather(sample(), *[client(j) for j in range(a.clients)])
            elapsed = time.perf_counter() - start
            srv.check_alive()
    finally:
        srv.stop()
    busy = []
    for running, m in readings:
        if running and m["quality"]["delta_ppl_est"] is not None:
            busy.append((m["quality"]["delta_ppl_est"], m["mem"]["kv_bytes"] / max(1, m["mem"]["kv_budget_bytes"])))
    last = readings[-1][1]
    return {
        "build": label, "round": rnd, "readings": len(busy),
        "over": sum(e > a.budget for e, _ in busy) / max(1, len(busy)),
        "estimate": statistics.fmean(e for e, _ in busy) if busy else None,
        "kv_use": statistics.fmean(u for _, u in busy) if busy else None,
        "switches": last.get("kv_profile_switches_total", 0),
        "refits": last.get("kv_threshold_refits_total", 0),
        "profile": last["models"][0]["kv_policy"]["profile"],
        "thresholds": last["models"][0]["kv_policy"]["level_thresholds"],
        "tok_s": sum(r.tokens for r in done) / elapsed,
    }


def show(rows, budget):
    print(f"\nquality budget {budget}% (relative delta-PPL); readings while requests were in flight\n")
    print("| build | round | over budget | mean estimate | mean KV use | profile switches | threshold steps "
          "| tok/s | profile, thresholds at the end |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        t = r["thresholds"]
        est = "-" if r["estimate"] is None else f"{r['estimate']:.3f}%"
        use = "-" if r["kv_use"] is None else f"{r['kv_use']:.2f}"
        print(f"| {r['build']} | {r['round']} | {100 * r['over']:.0f}% of {r['readings']} | {est} | {use} "
              f"| {r['switches']} | {r['refits']} | {r['tok_s']:.1f} | {r['profile']} "
              f"{t['L1_int8']}/{t['L2_int4']}/{t['L3_evict']} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="a safetensors folder with a calibration table")
    p.add_argument("--build", action="append", required=True, metavar="LABEL=LLMR",
                   help="an llmr binary to run, with the label the table gives it (repeat)")
    p.add_argument("--budget", type=float, default=0.15, help="quality budget, relative delta-PPL in percent")
    p.add_argument("--profile", default="balanced", help="the profile each run starts from")
    p.add_argument("--seconds", type=float, default=120)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--ctx-size", dest="ctx", type=int, default=2048)
    p.add_argument("--prompt-tokens", type=int, default=1500)
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    if not (a.model / CALIBRATION).is_file():
        sb.die(f"{a.model} has no {CALIBRATION}: run `kv-eval --model {a.model} --text ... --calibrate` first")
    builds = [b.split("=", 1) for b in a.build]
    sb.ensure_venv()
    corpus = sb.Corpus(Path.home() / ".cache/llmr/models/corpus/hamlet_gut.txt")
    import tempfile
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmr-slow-loop-") as logdir:
        for rnd in range(1, a.rounds + 1):
            for label, exe in (builds if rnd % 2 else builds[::-1]):
                sb.log(f"round {rnd}: {label}")
                rows.append(asyncio.run(run_build(label, exe, a, corpus, logdir, rnd)))
                show(rows[-1:], a.budget)
    show(rows, a.budget)


if __name__ == "__main__":
    main()
