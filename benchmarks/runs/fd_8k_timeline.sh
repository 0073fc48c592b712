#!/bin/sh
# Where an 8K decode step's time goes (issue 20, world 1): timeline builds of examples/flash_decode_splits.tile at
# 128 and 96 query heads with the bench's split counts, a Perfetto trace each and its per-stage summary. Since
# session 11 a folded producer's record ends before the merges it runs, so the split records are the stream alone.
# Usage, from the repository root on one GPU: sh benchmarks/runs/fd_8k_timeline.sh [OUT_DIR]
set -e
out=${1:-${OUT:-/tmp}/fd_8k_timeline}
mkdir -p "$out"
for cfg in "16 16 512 512" "12 22 384 512"; do
  set -- $cfg
  python3 -m tilec taxes examples/flash_decode_splits.tile --world 1 -D B=1 -D HKV=$1 -D G=8 -D D=128 -D S=8192 \
    -D NS=$2 -D L=$3 -D BS=$4 --measure --timeline --trace "$out/trace_h$1.json" > "$out/timeline_h$1.log" 2>&1
  grep -A6 "^fused-push: call" "$out/timeline_h$1.log"
  python3 benchmarks/runs/ragged/trace_summary.py "$out/trace_h$1.json" fused-push
done
