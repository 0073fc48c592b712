#!/bin/sh
# Flash decode's tail after the stream (the local merge, exchange and combine; fold-last and its shared form), one
# H200, world 1, bf16, device time of CUDA graph replays. Results: benchmarks/results/h200-1gpu/decode_tail/ (its
# README says which part made which file). Run from the repository root: sh benchmarks/runs/decode_tail.sh PART
#   ab [WORLD]   decode-quick, fused-push and specialized: without fold-last (--fold off), with it, with the tail
#                by KV head (decode_tail/flash_decode_bygroup.tile), and the free split count (WORLD 2: two H200s)
#   bench        decode-quick and decode-paper, fused-push, as the code stands
#   timelines    where the time goes: timeline builds at 8K and 64K keys, with and without fold-last
#   bykvhead     the tail tiled by the G heads of a KV head (decode_tail/flash_decode_g.tile): bench and 8K timeline
#   merge        one program's lse_merge by code form (decode_tail/merge_probe.py)
#   sleep        a sleep between a spinning wait's polls: fold x sleep A/B, and the split example at 200 / 0 ns
set -e
out=${OUT:-benchmarks/results/h200-1gpu/decode_tail}
mkdir -p "$out"
quick="--world 1 --shapes decode-quick --schedules fused-push --iters 20"
d8k="-D B=1 -D HKV=16 -D G=8 -D D=128 -D S=8192 -D BS=512"
d64k="-D B=1 -D HKV=12 -D G=8 -D D=128 -D S=65536 -D BS=4096"
case "$1" in
  ab)
    world=${2:-1}
    run() {
      if [ "$world" = 1 ]; then python -m tilec bench "$@" --world 1; else
        NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
          torchrun --standalone --nproc-per-node "$world" -m tilec bench "$@"; fi
    }
    args="--shapes decode-quick --schedules fused-push,specialized --iters 20"
    run examples/flash_decode.tile $args --fold off --out "$out/w$world-nofold"
    run examples/flash_decode.tile $args --out "$out/w$world-fold"
    run benchmarks/runs/decode_tail/flash_decode_bygroup.tile $args --out "$out/w$world-bygroup"
    run examples/flash_decode_splits.tile $args --out "$out/w$world-splits" ;;
  bench)
    python -m tilec bench examples/flash_decode.tile $quick --out "$out/quick" > "$out/flash_decode_quick.log" 2>&1
    python -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-paper --schedules fused-push \
      --iters 10 --out "$out/paper" > "$out/fd_paper.log" 2>&1 ;;
  timelines)
    for f in on off; do
      name=$([ $f = on ] && echo fold || echo nofold)
      python -m tilec taxes examples/flash_decode.tile --world 1 $d8k --measure --timeline --fold $f \
        > "$out/fd8k_${name}_timeline.log" 2>&1
      python -m tilec taxes examples/flash_decode.tile --world 1 $d64k --measure --timeline --fold $f \
        > "$out/fd64k_${name}_timeline.log" 2>&1
    done ;;
  bykvhead)
    p=benchmarks/runs/decode_tail/flash_decode_g.tile
    python -m tilec bench $p $quick --out "$out/bykvhead" > "$out/fd_bykvhead.log" 2>&1
    python -m tilec bench $p $quick --fold off --out "$out/bykvhead_nofold" > "$out/fd_bykvhead_nofold.log" 2>&1
    python -m tilec taxes $p --world 1 $d8k --measure --timeline > "$out/fd_bykvhead_8k_timeline.log" 2>&1 ;;
  merge)
    python benchmarks/runs/decode_tail/merge_probe.py > "$out/merge_probe.log" 2>&1 ;;
  sleep)
    for f in on off; do for ns in 0 200 1000; do
      python benchmarks/runs/decode_tail/decode_ab.py "fold=$f sleep=${ns}ns" --fold $f --wait-sleep-ns $ns
    done; done 2>&1 | grep -v Warning > "$out/decode_ab.log"
    for ns in 200 0; do
      python -m tilec bench examples/flash_decode_splits.tile $quick --wait-sleep-ns $ns --out "$out/sleep$ns" \
        > "$out/fd_splits_quick_sleep$ns.log" 2>&1
    done ;;
  *) echo "usage: $0 ab [WORLD]|bench|timelines|bykvhead|merge|sleep" >&2; exit 2 ;;
esac
