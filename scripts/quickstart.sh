#!/usr/bin/env bash
# The main job on the embedded default (tiny Qwen3-Omni, CPU): install what is missing, start the
# Serve app, send one chat request with text + audio output through the openai client, write the
# audio to out/answer.wav, print the text and the time to first audio, stop the app.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export RAY_AUTH_MODE=disabled PATH="$PWD/.venv/bin:$PATH"
mkdir -p out
if curl -s -o /dev/null http://127.0.0.1:8000/ 2>/dev/null; then
  echo "quickstart: something already listens on 127.0.0.1:8000; stop it first" >&2; exit 1
fi
# In its own session: stopping Serve must not signal this script (its exit status is the answer's).
setsid serve run serve_configs/tiny_omni.yaml > out/serve.log 2>&1 &
pid=$!
stop() {
  kill -INT "$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  # What is left of its session: Ray's workers (proxy, replicas, engines) have process groups
  # of their own, so end the session, not the group (never `ray stop`: that would end every Ray
  # cluster of the user), and wait until they are gone and port 8000 is free.
  pkill -KILL -s "$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do
    pgrep -s "$pid" >/dev/null 2>&1 || curl -s -o /dev/null http://127.0.0.1:8000/ 2>/dev/null \
      || break
    sleep 1
  done
}
trap stop EXIT
healthy=0
for _ in $(seq 1 "${OMNI_RAY_START_TIMEOUT_S:-600}"); do
  curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { healthy=1; break; }
  kill -0 $pid 2>/dev/null || { cat out/serve.log; exit 1; }
  sleep 1
done
if [ "$healthy" != 1 ]; then
  tail -n 40 out/serve.log
  echo "quickstart: the app was not healthy within ${OMNI_RAY_START_TIMEOUT_S:-600} s (out/serve.log)" >&2
  exit 1
fi
python examples/chat_client.py --url http://127.0.0.1:8000/v1 --out out/answer.wav "$@"
