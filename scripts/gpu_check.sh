#!/usr/bin/env bash
# The GPU check before landing a change to runners/models/stages (benchmarks/README.md "GPU check"):
#   bash scripts/gpu_check.sh [--device cuda|cpu] [--out DIR] [--phases tiny,standin,offline] ...
# Uses .venv/bin/python when there is one, else python3 (a machine with the packages on
# PYTHONPATH and `serve` on PATH). Exit status: 1 on any FAIL line.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export RAY_AUTH_MODE=disabled PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m benchmarks.gpu_check "$@"
