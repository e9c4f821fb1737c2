#!/usr/bin/env bash
# Regenerate every CPU result under benchmarks/results/ and the README's results table.
# About 12 minutes on 2 cores. Usage: bash benchmarks/run_all.sh   (PYTHON=... to override)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python
export RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error
start=$(date +%s)

"$PY" -m pytest -q -p no:cacheprovider tests/benchmarks   # the pure pieces, < 5 s
"$PY" -m benchmarks.transport_bench                       # ~1 min
"$PY" -m benchmarks.push_fanin_bench                      # ~30 s
"$PY" -m benchmarks.compare --num-prompts 5 --max-tokens 64 --max-audio-frames 150
"$PY" -m benchmarks.serve_bench --start tiny-async,tiny-sync --concurrency 1,4,8 \
    --num-requests 8 --max-tokens 32 --max-audio-frames 50 --out serve_cpu
"$PY" -m benchmarks.realtime_bench --start tiny-async --concurrency 1,8,32 \
    --max-audio-frames 50 --out realtime_cpu                # ~2 min; needs espeak-ng
"$PY" -m benchmarks.report

echo "run_all: $(( $(date +%s) - start )) s"
