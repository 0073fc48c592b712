#!/bin/sh
# Issue 20, the tail after the stream (shared flags + fold-last): flash decode before / after, bf16, device time.
# Usage, from the repository root: sh benchmarks/runs/tail_ab.sh 1   (one H200)   or   sh benchmarks/runs/tail_ab.sh 2
# (two H200s, one rank per GPU). Three rows per shape:
#   TILEC_FOLD=0        one flag per producer tile only (the local merge, exchange and combine as their own tasks)
#   default             + fold-last (the last split of a KV head merges and pushes its heads; specialized: the last
#                       pull of a head combines)
#   bygroup.tile        + the merge / exchange / combine over the G heads of a KV head as one task
#   splits              examples/flash_decode_splits.tile: the default with NS splits of L keys chosen per shape
# Each row set goes to its own --out folder under ${OUT:-/tmp}/tail_ab (not benchmarks/results).
set -e
world=${1:-1}
out=${OUT:-/tmp}/tail_ab
run() {
  if [ "$world" = 1 ]; then tilec bench "$@" --world 1; else
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
      torchrun --standalone --nproc-per-node "$world" -m tilec bench "$@"; fi
}
args="--shapes decode-quick --schedules fused-push,specialized --iters 20"
TILEC_FOLD=0 run examples/flash_decode.tile $args --out "$out/w$world-nofold"
run examples/flash_decode.tile $args --out "$out/w$world-fold"
run benchmarks/runs/tail/flash_decode_bygroup.tile $args --out "$out/w$world-bygroup"
run examples/flash_decode_splits.tile $args --out "$out/w$world-splits"  # + the split count chosen per shape
