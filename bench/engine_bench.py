#!/usr/bin/env python3
"""An engine plugin against llama.cpp's own tools, side by side, in one run.

For each model: llama-bench (pp, tg) and llama-batched-bench (aggregate decode at several
concurrencies) built from the llama-cpp-python sdist's vendored llama.cpp, and llmr's
engine-bench driving the plugin through the engine host. Runs alternate (reference, ours,
reference, ours...) so slow drift of a shared machine hits both sides; medians are reported with
the ratio llmr / reference.

  bench/engine_bench.py [--engine llama_cpp|native] [--models smollm2,gemma3] [--threads 2]
                        [--rounds 3] [--smoke] [--write]

--engine native runs the native plugin on the model's Hugging Face folder (`NAME-hf`, bf16
safetensors) and the llama.cpp tools on the F16 GGUF holding the same values (`NAME-f16`), and
adds Hugging Face transformers (torch, CPU) on the same folder when the reference venv exists
(scripts/reference-venv; --no-transformers skips it).

--write appends the table to bench/RESULTS.md with the date, commit, machine and command.
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = {
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}
# The same weights for the native engine (folder) and for llama.cpp (F16 GGUF).
NATIVE_MODELS = {
    "smollm2": ("smollm2-hf", "smollm2-135m-instruct-f16.gguf"),
    "gemma3": ("gemma3-hf", "gemma-3-270m-f16.gguf"),
    "qwen2.5": ("qwen2.5-hf", "qwen2.5-coder-0.5b-instruct-f16.gguf"),
}
REFERENCE_PYTHON = Path.home() / ".cache/llmr/venv-reference/bin/python"


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def target_dir():
    return Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))


def reference_tools():
    out = sh([str(REPO / "bench/reference/build.sh")])
    tools = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return tools


def llama_bench(tool, model, threads, pp, tg, reps):
    out = sh([tool, "-m", model, "-p", str(pp), "-n", str(tg), "-t", str(threads), "-r", str(reps), "-o", "json"])
    rows = json.loads(out)
    res = {}
    for row in rows:
        if row.get("n_prompt", 0) > 0 and row.get("n_gen", 0) == 0:
            res["pp"] = row["avg_ts"]
        elif row.get("n_gen", 0) > 0 and row.get("n_prompt", 0) == 0:
            res["tg"] = row["avg_ts"]
    return res


def batched_bench(tool, model, threads, npp, ntg, npl):
    out = sh([tool, "-m", model, "-c", "8192", "-b", "2048", "-ub", "512", "-npp", str(npp), "-ntg", str(ntg),
              "-npl", ",".join(map(str, npl)), "-t", str(threads)])
    # Table rows: |  PP |  TG |  B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    res = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[0].isdigit():
            res[int(cells[2])] = float(cells[7])
    return res


def engine_bench(engine, model, threads, pp, tg, reps, npp, ntg, npl):
    exe = target_dir() / "release/engine-bench"
    out = sh([str(exe), "--plugin", str(REPO / "engines" / engine / "cpu"), "--model", model, "--threads", str(threads),
              "--pp", str(pp), "--tg", str(tg), "--reps", str(reps), "--npp", str(npp), "--ntg", str(ntg),
              "--concurrency", ",".join(map(str, npl))])
    d = json.loads(out)
    return {"pp": d["pp"]["tokens_per_s"], "tg": d["tg"]["tokens_per_s"],
            # Like llama-batched-bench's S_TG: the steps after every sequence had its first token
            # (it prefills all prompts before its first decode step).
            "batch": {b["sequences"]: b.get("all_decoding_tokens_per_s") or b["decode_tokens_per_s"] for b in d["batch"]},
            # From the first sequence's first token: the other prompts' processing falls inside.
            "batch_from_first": {b["sequences"]: b["decode_tokens_per_s"] for b in d["batch"]}}


def transformers_bench(folder, threads, pp, tg, reps):
    out = sh([str(REFERENCE_PYTHON), str(REPO / "bench/transformers_bench.py"), folder, "--threads", str(threads),
              "--pp", str(pp), "--tg", str(tg), "--reps", str(reps)])
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="llama_cpp", choices=["llama_cpp", "native"])
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--npl", default="1,4,8,16")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one round: checks the harness, not speed")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.pp, a.tg, a.reps, a.npl = 1, 32, 8, 1, "1,2"
    npl = [int(x) for x in a.npl.split(",")]
    npp, ntg = (32, 64) if not a.smoke else (8, 8)

    native = a.engine == "native"
    sh(["cargo", "build", "--release", "-p", "llmr-llama-cpp", "-p", "llmr-native-engine", "-p", "llmr-bench"], cwd=REPO)
    sh([str(REPO / "scripts/install-engines")], cwd=REPO)
    tools = reference_tools()
    cache = Path(os.environ.get("LLMR_MODEL_CACHE", Path.home() / ".cache/llmr/models"))
    names = a.models.split(",")
    fetch = [f"{n}{s}" for n in names for s in ("-hf", "-f16")] if native else names
    sh([str(REPO / "scripts/fetch-models"), *fetch])
    with_hf = native and not a.no_transformers and REFERENCE_PYTHON.exists()

    lines = []
    for name in names:
        if native:
            ours_model, ref_model = (str(cache / f) for f in NATIVE_MODELS[name])
        else:
            ours_model = ref_model = str(cache / MODELS[name])
        ref = {"pp": [], "tg": [], "batch": {n: [] for n in npl}}
        ours = {"pp": [], "tg": [], "batch": {n: [] for n in npl}, "batch_from_first": {n: [] for n in npl}}
        hf = {"pp": [], "tg": []}
        for r in range(a.rounds):
            print(f"[{name}] round {r + 1}/{a.rounds}", file=sys.stderr)
            lb = llama_bench(tools["llama-bench"], ref_model, a.threads, a.pp, a.tg, a.reps)
            ref["pp"].append(lb["pp"]); ref["tg"].append(lb["tg"])
            eb = engine_bench(a.engine, ours_model, a.threads, a.pp, a.tg, a.reps, npp, ntg, npl)
            ours["pp"].append(eb["pp"]); ours["tg"].append(eb["tg"])
            bb = batched_bench(tools["llama-batched-bench"], ref_model, a.threads, npp, ntg, npl)
            for n in npl:
                ref["batch"][n].append(bb[n])
                ours["batch"][n].append(eb["batch"][n])
                ours["batch_from_first"][n].append(eb["batch_from_first"][n])
            if with_hf:
                tb = transformers_bench(ours_model, a.threads, a.pp, a.tg, max(1, a.reps // 2))
                hf["pp"].append(tb["pp"]); hf["tg"].append(tb["tg"])
        med = statistics.median
        rows = [(f"pp{a.pp} (tok/s)", med(ref["pp"]), med(ours["pp"]), "pp"),
                (f"tg{a.tg} (tok/s)", med(ref["tg"]), med(ours["tg"]), "tg")]
        rows += [(f"decode, {n} seq (total tok/s)", med(ref["batch"][n]), med(ours["batch"][n]), None) for n in npl]
        rows += [(f"decode, {n} seq, llmr timed from its first first token", med(ref["batch"][n]),
                  med(ours["batch_from_first"][n]), None) for n in npl if n > 1]
        shown = Path(ref_model).name if not native else f"{Path(ours_model).name} (llama.cpp: {Path(ref_model).name})"
        lines.append(f"\n**{shown}**, {a.threads} threads, median of {a.rounds} rounds\n")
        if with_hf:
            lines.append("| figure | llama.cpp | llmr plugin | llmr / llama.cpp | transformers | llmr / transformers |")
            lines.append("|---|---:|---:|---:|---:|---:|")
        else:
            lines.append("| figure | llama.cpp | llmr plugin | llmr / llama.cpp |")
            lines.append("|---|---:|---:|---:|")
        for label, rv, ov, key in rows:
            line = f"| {label} | {rv:.1f} | {ov:.1f} | {ov / rv:.3f} |"
            if with_hf:
                line += f" {med(hf[key]):.1f} | {ov / med(hf[key]):.2f} |" if key else " | |"
            lines.append(line)

    commit = sh(["git", "rev-parse", "--short", "HEAD"], cwd=REPO).strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
    header = (f"\n### {datetime.date.today()} · commit {commit} · {cpu}, {os.cpu_count()} cores\n\n"
              f"Reference: {tools.get('version', '?')} (tools built by bench/reference/build.sh); "
              f"plugin: {a.engine} ({'bf16 safetensors; llama.cpp on the F16 GGUF of the same values' if native else tools.get('plugin_llama_cpp_version', 'llama-cpp-sys-2 0.1.161')}).\n"
              f"Command: `bench/engine_bench.py {' '.join(sys.argv[1:])}`\n"
              "Reference pp/tg: llama-bench; reference decode: llama-batched-bench S_TG "
              f"(npp {npp}, ntg {ntg}); llmr: bench/src/engine_bench.rs through the engine host, decode "
              "timed once every sequence has its first token, as S_TG is (the rows 'timed from its first "
              "first token' also count the other prompts' processing).\n")
    table = header + "\n".join(lines) + "\n"
    print(table)
    if a.write and not a.smoke:
        with open(REPO / "bench/RESULTS.md", "a") as f:
            f.write(table)


if __name__ == "__main__":
    main()
