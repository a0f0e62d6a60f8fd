#!/usr/bin/env python3
"""Repro for a serving slowdown: prompt processing and decode after idle caches piled up in the KV cache.

Against ONE server already running on 127.0.0.1:PORT (start it as bench/serve_bench.py does):
a ~1,000-token prompt on the fresh server, then 16 concurrent clients for 8 s (~110-token
prompts, 128 tokens each, which leaves 16 idle prefix caches behind), then two more ~1,000-token
prompts (different text, so nothing is cached). Prints TTFT and decode speed of each probe.

  bench/idle_cache_probe.py --port 18081 --model smollm2

Uses the bench venv (bench/serve_bench.py creates it).
"""
import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True                 # no __pycache__ in the working tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_bench as sb  # noqa: E402


async def main(a):
    import aiohttp
    corpus = sb.Corpus(Path.home() / ".cache/llmr/models/corpus/hamlet_gut.txt")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as s:
        cl = sb.Client(s, f"http://127.0.0.1:{a.port}", a.model, 0.8)

        async def probe(tag):
            r = await cl.chat(sb.user(corpus.passage(1000, f"idle-probe-{tag}")), 32, 1)
            print(f"{tag:>16}: {r.usage['prompt_tokens']}-token prompt, TTFT {r.ttft:.2f} s, decode "
                  f"{(r.tokens - 1) / (r.times[-1] - r.times[0]):.1f} tok/s", flush=True)

        await probe("fresh")
        until = time.perf_counter() + 8

        async def worker(j):
            i = 0
            while time.perf_counter() < until:
                k = f"idle-c16-{j}-{i}"
                await cl.chat(sb.user(corpus.passage(80, k) + "\n\nContinue this scene of Hamlet."), 128, sb.seed_of(k))
                i += 1

        t = time.perf_counter()
        await asyncio.gather(*(worker(j) for j in range(16)))
        print(f"{'16 clients':>16}: {time.perf_counter() - t:.1f} s", flush=True)
        await probe("after")
        await probe("after, again")


if __name__ == "__main__":
    sb.ensure_venv()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="smollm2")
    asyncio.run(main(ap.parse_args()))
