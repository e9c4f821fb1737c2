#!/usr/bin/env bash
# Install (idempotent) and run the whole test suite, slow engine tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export RAY_AUTH_MODE=disabled PATH="$PWD/.venv/bin:$PATH"
exec python -m pytest -q -p no:cacheprovider --timeout=900 "$@"
