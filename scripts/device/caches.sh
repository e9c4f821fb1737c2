#!/usr/bin/env bash
# usage: bash scripts/device/caches.sh sizes|pack [FIRST_PART]|unpack
# The compile and JIT caches a fresh GPU machine fills on the stand-in's first start (vLLM's
# torch.compile artifacts, Inductor's and Triton's kernels, FlashInfer's JIT), so a later session
# can carry them back instead of paying the start again. H100 and H200 are both sm_90: one set
# serves both. Each cache keys its entries by source and versions, so a stale entry is a miss,
# not a wrong kernel.
#   sizes          what each cache holds now (MiB)
#   pack [K]       all of them as one tar.gz, cut in 15 MiB parts; parts K, K+1, ... (at most 7,
#                  the device brings back 8 files of 16 MiB a call) copied to $OUT; refused
#                  when they hold more than CACHE_MAX_MIB (600) on disk (gzip would eat the lease)
#   unpack         joins $HOME/stash/cache.tgz.* (carried like the wheels) into place
dirs=($HOME/.cache/vllm $HOME/.cache/flashinfer $HOME/.triton/cache /tmp/torchinductor_$(whoami))
case "$1" in
  sizes)
    for d in "${dirs[@]}"; do [ -d "$d" ] && du -sm "$d"; done ;;
  pack)
    first=${2:-0}; pack=$HOME/cache_pack
    total=$(du -smc "${dirs[@]}" 2>/dev/null | tail -1 | cut -f1)
    if [ ! -d $pack ] && [ "$total" -gt "${CACHE_MAX_MIB:-600}" ]; then
      echo "cache: $total MiB on disk, over CACHE_MAX_MIB=${CACHE_MAX_MIB:-600}: not packed"; exit 1
    fi
    if [ ! -d $pack ]; then
      mkdir -p $pack
      existing=(); for d in "${dirs[@]}"; do [ -d "$d" ] && existing+=("$d"); done
      tar -czf - "${existing[@]}" 2>/dev/null | split -b 15M -d -a 2 - $pack/cache.tgz.
    fi
    n=$(ls $pack | wc -l); echo "cache: $n parts of 15 MiB ($(du -sm $pack | cut -f1) MiB)"
    for f in $(ls $pack | sort | tail -n +$((first + 1)) | head -7); do cp $pack/$f $OUT/; done
    ls $OUT ;;
  unpack)
    if ls $HOME/stash/cache.tgz.* >/dev/null 2>&1; then
      cat $HOME/stash/cache.tgz.* | tar -C / -xzf - && echo "caches: $(du -sm "${dirs[@]}" 2>/dev/null | awk '{s+=$1} END {print s}') MiB in place"
    fi ;;
  *) echo "usage: $0 sizes|pack [FIRST_PART]|unpack"; exit 2 ;;
esac
