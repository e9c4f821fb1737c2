#!/usr/bin/env bash
# usage: bash scripts/device/launch.sh COMMIT BUDGET_S [gpu_check args...]
# copies the tree to $HOME/repo and starts gpu_check there, detached; outputs in $HOME/gpu_out
export PYTHONPATH=$HOME/site PATH=$HOME/site/bin:$PATH RAY_AUTH_MODE=disabled
test -d $HOME/site || { echo "no install on this machine"; exit 3; }
commit=$1; budget=$2; shift 2
rm -rf $HOME/repo $HOME/gpu_out; mkdir -p $HOME/repo $HOME/gpu_out
tar --exclude=./.devwheels --exclude=./.git --exclude=./.venv -cf - . | tar -C $HOME/repo -xf -
cd $HOME/repo
setsid nohup bash scripts/gpu_check.sh --device cuda --out $HOME/gpu_out --commit $commit \
  --time-budget $budget "$@" > $HOME/gpu_out/console.txt 2>&1 < /dev/null &
echo $! > $HOME/gpu_out/pid
sleep 20; tail -5 $HOME/gpu_out/console.txt
