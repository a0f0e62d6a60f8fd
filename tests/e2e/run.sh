#!/usr/bin/env bash
# End-to-end tests of `llmr serve` (and of `llmr router` with a node) with the official OpenAI and
# Anthropic Python SDKs.
#
#   tests/e2e/run.sh [PYTEST ARGS...]        e.g. tests/e2e/run.sh -k tool -x
#
# Needs: python3 (3.11+) with the venv module, the llmr binary (cargo build -p llmr), the engine
# plugins (scripts/install-engines) and the models (scripts/fetch-models smollm2 qwen2.5 minilm).
# The tests start and stop their own servers (see conftest.py for LLMR_BIN, LLMR_MODEL_CACHE,
# LLMR_ENGINES_DIR).
#
# The venv lives at ${LLMR_E2E_VENV:-$HOME/.cache/llmr/venv-e2e}; requirements.txt is installed
# into it again only when it changed (a stamp file holds its sha256).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd "$HERE/../.." && pwd -P)
VENV=${LLMR_E2E_VENV:-$HOME/.cache/llmr/venv-e2e}
REQ=$HERE/requirements.txt
STAMP=$VENV/.llmr-requirements.sha256

die() {
    echo "tests/e2e/run.sh: error: $*" >&2
    exit 1
}

command -v python3 >/dev/null || die "python3 is required (3.11 or newer)"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "python3 is $(python3 -c 'import sys; print(sys.version.split()[0])'); 3.11 or newer is required"

if [[ ! -x $VENV/bin/python ]]; then
    python3 -c 'import venv, ensurepip' 2>/dev/null ||
        die "python3's venv module (with ensurepip) is missing: install it (Debian/Ubuntu: apt-get install python3-venv, or python3.X-venv for your version) and run again"
    echo "tests/e2e/run.sh: creating the venv $VENV" >&2
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
fi

want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ ! -f $STAMP ]] || [[ "$(cat "$STAMP")" != "$want" ]]; then
    echo "tests/e2e/run.sh: installing tests/e2e/requirements.txt into $VENV" >&2
    rm -f "$STAMP"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2 ||
        die "upgrading pip in $VENV failed"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ" >&2 ||
        die "pip install -r $REQ failed"
    echo "$want" >"$STAMP"
fi

cd "$REPO_ROOT"
# No .pytest_cache or __pycache__ in the working tree.
export PYTHONDONTWRITEBYTECODE=1
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/e2e "$@"
