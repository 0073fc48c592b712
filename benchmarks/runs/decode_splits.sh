#!/bin/sh
# Flash decode's split count: examples/flash_decode_splits.tile (NS splits of L keys, chosen per shape so the split
# tasks fill every SM twice) against power-of-two splits and SDPA, one H200, world 1, bf16. Results:
# benchmarks/results/h200-1gpu/decode_splits/. Run from the repository root: sh benchmarks/runs/decode_splits.sh PART
#   bench      decode-paper and decode-quick of the split example, decode-paper of the power-of-two example
#   ragged     free vs power-of-two split counts on the same allocation (decode_splits/ragged_probe.py; also with
#              RAGGED_QUICK=1), and where K and V sit (placement_probe.py)
#   small      8K-16K: split count, attend block, warps and stages around the bench's config; PDL off
#   evict      cache hints on the streamed K/V loads
#   timeline   where 8K's time goes at 96 heads: a timeline build, its trace summarized per stage
set -e
out=${OUT:-benchmarks/results/h200-1gpu/decode_splits}
mkdir -p "$out"
p=benchmarks/runs/decode_splits
case "$1" in
  bench)
    python -m tilec bench examples/flash_decode_splits.tile --world 1 --shapes decode-paper --schedules fused-push \
      --iters 10 --out "$out/splits_paper" > "$out/fd_splits_paper.log" 2>&1
    python -m tilec bench examples/flash_decode_splits.tile --world 1 --shapes decode-quick --schedules fused-push \
      --iters 20 --out "$out/splits_quick" > "$out/fd_splits_quick.log" 2>&1
    python -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-paper --schedules fused-push \
      --iters 10 --out "$out/paper" > "$out/fd_paper.log" 2>&1 ;;
  ragged)
    python $p/ragged_probe.py > "$out/ragged_probe.log" 2>&1
    RAGGED_QUICK=1 python $p/ragged_probe.py > "$out/ragged_probe_quick.log" 2>&1
    python $p/placement_probe.py > "$out/placement_probe.log" 2>&1 ;;
  small)
    python $p/small_probe.py > "$out/small_probe.log" 2>&1
    SMALL_SWEEP=one python $p/small_probe.py --pdl off > "$out/small_probe_nopdl.log" 2>&1 ;;
  evict)
    python $p/evict_probe.py > "$out/evict_probe.log" 2>&1 ;;
  timeline)
    python -m tilec taxes examples/flash_decode_splits.tile --world 1 -D B=1 -D HKV=12 -D G=8 -D D=128 -D S=8192 \
      -D NS=22 -D L=384 -D BS=512 --measure --timeline --trace "$out/trace_h96.json" \
      > "$out/fd_splits_8k_h96_timeline.log" 2>&1
    python benchmarks/runs/decode_merge_chain/trace_summary.py "$out/trace_h96.json" fused-push \
      > "$out/fd_splits_8k_h96_trace_summary.txt" ;;
  *) echo "usage: $0 bench|ragged|small|evict|timeline" >&2; exit 2 ;;
esac
