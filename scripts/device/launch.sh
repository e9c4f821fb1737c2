#!/usr/bin/env bash
# usage: [GPU_TESTS="tests/a.py tests/b.py"] [GPU_BENCH="python -m benchmarks.x ..."] \
#        bash scripts/device/launch.sh COMMIT BUDGET_S [gpu_check args...]
# copies the tree to $HOME/repo and starts gpu_check there, detached; outputs in $HOME/gpu_out.
# GPU_TESTS: pytest paths run first in the same detached job (gpu_tests.txt), e.g. the CUDA-only
# tests CI skips; their time comes out of the same device budget, so keep them short.
# GPU_BENCH: a command run after them, before gpu_check, in the tree ($HOME/repo), its output in
# gpu_bench.txt; results it writes to $HOME/gpu_out as .json/.txt come back with poll.sh.
export PYTHONPATH=$HOME/site PATH=$HOME/site/bin:$PATH RAY_AUTH_MODE=disabled
test -d $HOME/site || { echo "no install on this machine"; exit 3; }
commit=$1; budget=$2; shift 2
bash $(dirname $0)/caches.sh unpack  # a carried set of compile caches (caches.sh), if any
rm -rf $HOME/repo $HOME/gpu_out; mkdir -p $HOME/repo $HOME/gpu_out
tar --exclude=./.devwheels --exclude=./.devcache --exclude=./.git --exclude=./.venv -cf - . | tar -C $HOME/repo -xf -
cd $HOME/repo
# One detached job: the tests (if any), then gpu_check with what is left of BUDGET_S.
setsid nohup bash -c 'tests=$0 bench=$1 budget=$2; shift 2; t0=$SECONDS
  if [ -n "$tests" ]; then
    python -m pytest -q -p no:cacheprovider $tests > $HOME/gpu_out/gpu_tests.txt 2>&1
    echo "rc=$? in $((SECONDS-t0)) s" >> $HOME/gpu_out/gpu_tests.txt
  fi
  if [ -n "$bench" ]; then
    t1=$SECONDS; bash -c "$bench" > $HOME/gpu_out/gpu_bench.txt 2>&1
    echo "rc=$? in $((SECONDS-t1)) s" >> $HOME/gpu_out/gpu_bench.txt
  fi
  exec bash scripts/gpu_check.sh --time-budget $((budget-SECONDS+t0)) "$@"' \
  "${GPU_TESTS:-}" "${GPU_BENCH:-}" $budget --device cuda --out $HOME/gpu_out --commit $commit "$@" \
  > $HOME/gpu_out/console.txt 2>&1 < /dev/null &
echo $! > $HOME/gpu_out/pid
sleep 20; tail -5 $HOME/gpu_out/console.txt
