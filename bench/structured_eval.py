#!/usr/bin/env python3
"""Structured output under sampling: does every answer follow its schema?

Starts `llmr serve` once with the test models in both formats (GGUF through the llama.cpp plugin,
Hugging Face folders through the native engine) and, per model, sends SAMPLES chat requests at
temperature 1 (distinct seeds, 4 at a time) with a `json_schema` response format (nesting, an
enum, an array, bounds, required fields), then checks every answer with `jsonschema`. On the
tool-calling model (Qwen2.5) it also forces tool calls, `required` and named, SAMPLES each, and
checks every call's name and arguments against the tool's schema; and leaves the choice to the
model (`tool_choice: auto`) with `strict` tools and, as the baseline, without: every call must be
valid and no broken call may be left in the content (failures of the baseline are reported, not
failed on).

  ~/.cache/llmr/venv-e2e/bin/python bench/structured_eval.py [--samples 200] [--models smollm2,qwen] [--only auto]

(`jsonschema` is pinned in tests/e2e/requirements.txt; tests/e2e/run.sh makes that venv.) Needs
`cargo build -p llmr`, scripts/install-engines and scripts/fetch-models smollm2 qwen2.5 gemma3.
Prints one line per check: answers that parse and validate, answers cut by max_tokens (finish
`length`: honest, and not counted as failures of the schema), failures.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import jsonschema

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("LLMR_MODEL_CACHE", Path.home() / ".cache/llmr/models"))
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
MODELS = {
    "smollm2": ["smollm2-135m-instruct-q4_1.gguf", "smollm2-hf"],
    "qwen": ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-hf"],
    "gemma3": ["gemma-3-270m-q4_k_m.gguf", "gemma3-hf"],
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["engineer", "artist", "doctor", "teacher"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30}},
            "required": ["city", "country"],
            "additionalProperties": False,
        },
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 4},
    },
    "required": ["name", "age", "role", "address", "skills"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The local time in a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def start(models):
    args = [str(TARGET / "debug/llmr"), "serve", "--port", "0", "--threads", "2", "--cache-mib", "0",
            "--engines-dir", str(REPO / "engines")]
    for alias, path in models:
        args += ["--model", f"{alias}={path}"]
    env = {**os.environ, "HOME": tempfile.mkdtemp(prefix="llmr-structured-")}
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        if line.startswith("llmr listening on "):
            url = line.split()[3]
            break
    else:
        sys.exit("llmr serve exited before listening")
    # Keep draining stderr so the server never blocks on a full pipe.
    concurrent.futures.ThreadPoolExecutor(1).submit(lambda: [None for _ in proc.stderr])
    return proc, url


def tally(results):
    ok = sum(r in ("ok", "text") for r in results)
    cut = sum(r == "length" for r in results)
    bad = [r for r in results if r not in ("ok", "text", "length")]
    return ok, cut, bad


def schema_answer(url, model, seed):
    body = {"model": model, "temperature": 1, "seed": seed, "max_tokens": 200,
            "messages": [{"role": "user", "content": "Invent a person and describe them as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}}
    choice = post(f"{url}/v1/chat/completions", body)["choices"][0]
    if choice["finish_reason"] == "length":
        return "length"
    try:
        jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)
        return "ok"
    except Exception as e:  # noqa: BLE001 - every failure is reported as it is
        return f"invalid: {e!s:.120} in {choice['message']['content']!r:.200}"


def tool_answer(url, model, seed, choice):
    body = {"model": model, "temperature": 1, "seed": seed, "max_tokens": 100, "parallel_tool_calls": False,
            "messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
            "tools": [WEATHER, TIME], "tool_choice": choice}
    c = post(f"{url}/v1/chat/completions", body)["choices"][0]
    if c["finish_reason"] == "length":
        return "length"
    calls = c["message"].get("tool_calls") or []
    if c["finish_reason"] != "tool_calls" or len(calls) != 1:
        return f"no call: {c!s:.200}"
    tools = {"get_weather": WEATHER, "get_time": TIME}
    name = calls[0]["function"]["name"]
    if name not in tools or (choice != "required" and name != "get_weather"):
        return f"wrong function {name}"
    try:
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), tools[name]["function"]["parameters"])
        return "ok"
    except Exception as e:  # noqa: BLE001
        return f"invalid arguments: {e!s:.120}"


def strict(tool):
    """`tool` with `strict: true` and no properties beyond its schema's."""
    t = json.loads(json.dumps(tool))
    t["function"]["strict"] = True
    t["function"]["parameters"]["additionalProperties"] = False
    return t


def auto_answer(url, model, seed, strict_tools):
    """`tool_choice: auto`: the model may answer or call. A call must be of an offered function with
    arguments valid for its schema; an answer must not be a call that failed to parse (a
    `<tool_call>` block or a JSON object left in the content). "ok" for a call, "text" for an answer."""
    tools = [strict(WEATHER), strict(TIME)] if strict_tools else [WEATHER, TIME]
    body = {"model": model, "temperature": 1, "seed": seed, "max_tokens": 100, "parallel_tool_calls": False,
            "messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
            "tools": tools, "tool_choice": "auto"}
    c = post(f"{url}/v1/chat/completions", body)["choices"][0]
    if c["finish_reason"] == "length":
        return "length"
    calls = c["message"].get("tool_calls") or []
    content = (c["message"].get("content") or "").strip()
    if not calls:
        if "<tool_call>" in content or content.startswith("{"):
            return f"broken call left as content: {content!r:.200}"
        return "text"
    by_name = {t["function"]["name"]: t for t in tools}
    for call in calls:
        name = call["function"]["name"]
        if name not in by_name:
            return f"wrong function {name}"
        try:
            jsonschema.validate(json.loads(call["function"]["arguments"]), by_name[name]["function"]["parameters"])
        except Exception as e:  # noqa: BLE001
            return f"invalid arguments: {e!s:.120}"
    return "ok"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--models", default="smollm2,qwen,gemma3")
    ap.add_argument("--only", default=None, help="run only the checks whose name contains this (e.g. auto)")
    args = ap.parse_args()
    served = []
    for name in args.models.split(","):
        gguf, hf = MODELS[name]
        served += [(f"{name}-gguf", CACHE / gguf), (f"{name}-hf", CACHE / hf)]
    proc, url = start(served)
    failed = False
    try:
        named = {"type": "function", "function": {"name": "get_weather"}}
        checks = []
        for alias, _ in served:
            checks.append((alias, "json_schema", lambda seed, a=alias: schema_answer(url, a, seed)))
            if alias.startswith("qwen"):
                checks.append((alias, "tool_choice required", lambda seed, a=alias: tool_answer(url, a, seed, "required")))
                checks.append((alias, "tool_choice named", lambda seed, a=alias: tool_answer(url, a, seed, named)))
                checks.append((alias, "auto, strict tools", lambda seed, a=alias: auto_answer(url, a, seed, True)))
                checks.append((alias, "auto (not strict)", lambda seed, a=alias: auto_answer(url, a, seed, False)))
        checks = [c for c in checks if args.only is None or args.only in c[1]]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for alias, what, answer in checks:
                results = list(pool.map(answer, range(args.samples)))
                ok, cut, bad = tally(results)
                # Without `strict`, nothing holds a call to its schema: its failures are the baseline.
                failed |= bool(bad) and "not strict" not in what
                texts = sum(r == "text" for r in results)
                answered = f" ({texts} answered in text)" if texts else ""
                print(f"{alias:14} {what:22} {ok:4} valid{answered}, {cut:3} cut by max_tokens, {len(bad):3} failures",
                      flush=True)
                for b in bad[:3]:
                    print(f"    {b}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
