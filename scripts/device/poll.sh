#!/usr/bin/env bash
# usage: bash scripts/device/poll.sh MAX_WAIT_S — wait while gpu_check runs, then bring back its files
# (a line a minute meanwhile: the check's latest, so a call that is cut off still showed progress;
# and its small result files copied to $OUT each minute, so a call cut off at the device's
# time limit still brings back what the check had written by then)
o=$HOME/gpu_out; end=$((SECONDS+$1)); pid=$(cat $o/pid); next=$((SECONDS+60))
results() { cp $o/*.json $o/*.txt $OUT/ 2>/dev/null; }
while kill -0 $pid 2>/dev/null && [ $SECONDS -lt $end ]; do
  sleep 5
  if [ $SECONDS -ge $next ]; then
    echo "[$SECONDS s] $(tail -1 $o/gpu_check.txt 2>/dev/null || tail -1 $o/console.txt)"
    results
    next=$((SECONDS+60))
  fi
done
results
mkdir -p $OUT/logs $OUT/configs; cp $o/configs/* $OUT/configs/ 2>/dev/null
for f in $o/logs/*.log; do [ -f "$f" ] && tail -c 4000000 "$f" | gzip > $OUT/logs/$(basename $f).gz; done
kill -0 $pid 2>/dev/null && echo "STILL RUNNING" || echo "FINISHED"
tail -40 $o/gpu_check.txt 2>/dev/null || tail -40 $o/console.txt
