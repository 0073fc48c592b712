#!/bin/sh
# The merge chain after a KV head's last split (the 8K-16K decode gap to SDPA), one H200, world 1, bf16, the free
# split example. The probes patch the emitted Triton source inside the probe; tilec itself is unchanged by them.
# Results: benchmarks/results/h200-1gpu/decode_merge_chain/. Run from the repository root:
# sh benchmarks/runs/decode_merge_chain.sh PART
#   timeline    timeline builds at 8K keys, 128 and 96 heads, with Perfetto traces, each summarized per stage and
#               per KV head (the chain after its last split: merge_chain.py)
#   bound       the stream alone vs the step as emitted (tail_bound_probe.py; TAIL_PROBE=group: the group merge)
#   tma         K/V loads through TMA descriptors vs pointer loads
#   dynamic     more splits than programs, tasks claimed from an atomic counter
#   premerge    the waiting arrivals merging partials as they arrive
set -e
out=${OUT:-benchmarks/results/h200-1gpu/decode_merge_chain}
mkdir -p "$out"
p=benchmarks/runs/decode_merge_chain
case "$1" in
  timeline)
    mkdir -p "$out/fd_8k_timeline"
    for cfg in "16 16 512 512" "12 22 384 512"; do
      set -- $cfg
      python -m tilec taxes examples/flash_decode_splits.tile --world 1 -D B=1 -D HKV=$1 -D G=8 -D D=128 \
        -D S=8192 -D NS=$2 -D L=$3 -D BS=$4 --measure --timeline --trace "$out/fd_8k_timeline/trace_h$1.json" \
        > "$out/fd_8k_timeline/timeline_h$1.log" 2>&1
      python $p/trace_summary.py "$out/fd_8k_timeline/trace_h$1.json" fused-push
      python $p/merge_chain.py "$out/fd_8k_timeline/trace_h$1.json" > "$out/fd_8k_timeline/merge_chain_h$1.txt"
    done ;;
  bound)
    python $p/tail_bound_probe.py > "$out/tail_bound_probe.log" 2>&1
    TAIL_PROBE=group python $p/tail_bound_probe.py > "$out/tail_bound_probe_group.log" 2>&1 ;;
  tma) python $p/tma_probe.py > "$out/tma_probe.log" 2>&1 ;;
  dynamic) python $p/dynamic_probe.py > "$out/dynamic_probe.log" 2>&1 ;;
  premerge) python $p/premerge_probe.py > "$out/premerge_probe.log" 2>&1 ;;
  *) echo "usage: $0 timeline|bound|tma|dynamic|premerge" >&2; exit 2 ;;
esac
