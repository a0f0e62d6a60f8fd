#!/usr/bin/env bash
# Thread policy of the llama.cpp plugin: single-sequence decode (tg 128, median of 3) with 2 and 1
# threads, on a quiet machine and while another process spins on one core. Each argument is a
# plugin folder (manifest.json + library), e.g. engines/llama_cpp/cpu and a copy holding a build
# made with `cargo build --release -p llmr-llama-cpp --no-default-features` (no OpenMP).
#   bench/thread_policy.sh engines/llama_cpp/cpu [/tmp/no-omp/llama_cpp/cpu ...]
set -euo pipefail
cd "$(dirname "$0")/.."
bench="${CARGO_TARGET_DIR:-target}/release/engine-bench"
model="${MODEL:-$HOME/.cache/llmr/models/smollm2-135m-instruct-q4_1.gguf}"
[ -x "$bench" ] || { echo "build it first: cargo build --release -p llmr-bench" >&2; exit 2; }
tg() {
  "$bench" --plugin "$1" --model "$model" --tests tg --reps 3 --tg 128 --threads "$2" 2>/dev/null |
    python3 -c "import json, sys; print(round(json.load(sys.stdin)['tg']['tokens_per_s'], 1))"
}
for round in 1 2; do
  for plugin in "$@"; do
    for threads in 2 1; do
      quiet=$(tg "$plugin" "$threads")
      python3 -c "while True: pass" & spinner=$!
      busy=$(tg "$plugin" "$threads")
      kill "$spinner"; wait "$spinner" 2>/dev/null || true
      echo "round $round  $plugin  threads $threads: quiet $quiet tok/s, one core busy $busy tok/s"
    done
  done
done
