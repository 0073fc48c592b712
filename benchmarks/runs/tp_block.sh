#!/bin/sh
# tilec ops inside CUDA graphs and the TP block against plain TP / async-TP. Run from the repository root:
#   sh benchmarks/runs/tp_block.sh tests     # capture tests (world 1, and world 2 as two ranks on the GPU(s))
#   sh benchmarks/runs/tp_block.sh barrier   # us per op call: host barriers, device barriers, CUDA graph
#                                            #   -> results/h200-1gpu/op_barrier/op_call_barriers.log
#   sh benchmarks/runs/tp_block.sh w1        # one H200: results/h200-1gpu/tp_block/tp_block_w1_{auto,device}.*
#   sh benchmarks/runs/tp_block.sh w2        # two H200 under torchrun: results/h200-x2/tp_block/tp_block_w2_*.*
# Each TP run prints, per variant (tilec, plain, tilec-compile, *-graph, async-tp), max |err| vs the unsharded
# model, us/layer and tokens/s; barrier "auto" (host barriers in eager calls) vs "device" (device barrier kernels).
set -e
what=${1:-all}
shape="--hidden 4096 --inter 14336 --tokens 4096 --layers 2 --iters 10 --dtype bf16 --compile"
if [ "$what" = tests ] || [ "$what" = all ]; then
  python -m pytest -m gpu -q -rf tests/gpu/test_gpu_ops.py
fi
if [ "$what" = barrier ] || [ "$what" = all ]; then
  mkdir -p benchmarks/results/h200-1gpu/op_barrier
  python benchmarks/runs/op_barrier.py 1 2>&1 | tee benchmarks/results/h200-1gpu/op_barrier/op_call_barriers.log
fi
if [ "$what" = w1 ] || [ "$what" = all ]; then
  d=benchmarks/results/h200-1gpu/tp_block
  mkdir -p $d
  for b in auto device; do
    python examples/tp_block.py --world 1 --backend iris $shape --barrier $b --out $d/tp_block_w1_$b.json \
      2>&1 | tee $d/tp_block_w1_$b.log
  done
fi
if [ "$what" = w2 ]; then
  d=benchmarks/results/h200-x2/tp_block
  mkdir -p $d
  for b in auto device; do
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 torchrun --nproc-per-node 2 examples/tp_block.py \
      --backend iris $shape --barrier $b --out $d/tp_block_w2_$b.json 2>&1 | tee $d/tp_block_w2_$b.log
  done
fi
