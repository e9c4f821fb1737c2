#!/usr/bin/env bash
# usage: bash scripts/device/stop.sh — end a running check and its app (by pid: a `pkill -f`
# pattern would also match the shell running this command)
export PATH=$HOME/site/bin:$PATH
kill -- -$(cat $HOME/gpu_out/pid) 2>/dev/null
for p in $(pgrep -f "[s]erve run --address"); do kill -9 "$p"; done
ray stop --force >/dev/null 2>&1
echo stopped
