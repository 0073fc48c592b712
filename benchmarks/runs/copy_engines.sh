#!/bin/sh
# transport=dma: copy stages on the copy engines, and `--schedule auto`'s pick between them and the SM copies. Run
# from the repository root (NVLink multicast off for two GPUs). Results: benchmarks/results/h200-1gpu/copy_engines/
# and auto_pick/ (one H200); the world-2 parts write benchmarks/results/h200-x2/ (not yet run there).
#   sh benchmarks/runs/copy_engines.sh check       one H200: dma's GPU tests (worlds 1, 2, 4 share the GPU), a 4-rank run
#   sh benchmarks/runs/copy_engines.sh w1          one H200: world-1 bench, sm vs dma
#   sh benchmarks/runs/copy_engines.sh calibrate   one H200: the copy engines' rates (machine.json)
#   sh benchmarks/runs/copy_engines.sh auto        one H200: every variant and the auto row with that machine file, then
#                                                  auto against the best row per shape
#   sh benchmarks/runs/copy_engines.sh w2          two H200s: world-2 bench, sm vs dma
#   sh benchmarks/runs/copy_engines.sh w2-auto     two H200s: calibrate over both, then the auto row against the rest
# --no-tune: the first tile config for sm and dma alike (an A/B of the transport); drop it to tune each row.
set -e
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=flags,flags+dma,fused-push,fused-push+dma
one=benchmarks/results/h200-1gpu
two=benchmarks/results/h200-x2
case "$1" in
  check)
    python -m pytest -m gpu -q -rf tests/gpu/test_gpu_dma.py
    python -m tilec run examples/ag_gemm.tile -w 4 -s flags --transport dma --backend iris -D M=4096 -D N=1024 -D K=512
    python -m tilec run examples/ag_gemm.tile -w 2 -s fused-push --transport dma --backend iris -D M=1000 -D N=200 \
      -D K=136 ;;
  w1)
    python -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper --schedules $S --iters 20 --no-tune \
      --out $one/copy_engines/dma_w1 ;;
  calibrate)
    mkdir -p $one/copy_engines
    python -m tilec calibrate -o $one/copy_engines/machine.json > $one/copy_engines/calibrate_copy_engines.log 2>&1 ;;
  auto)
    mkdir -p $one/auto_pick
    TILEC_MACHINE=$one/copy_engines/machine.json TILEC_CACHE=$(mktemp -d) python -m tilec bench examples/ag_gemm.tile \
      --world 1 --shapes paper --iters 10 --no-tune --schedules auto,flags,flags+dma,fused-push,fused-push+dma,fused-pull \
      --out $one/auto_pick/auto_w1 > $one/auto_pick/auto_w1.log 2>&1
    python benchmarks/runs/auto_vs_best.py $one/auto_pick/auto_w1/*.json > $one/auto_pick/auto_vs_best_w1.log ;;
  w2)
    torchrun --standalone --nproc-per-node 2 -m tilec bench examples/ag_gemm.tile --shapes paper --schedules $S \
      --iters 20 --no-tune --out $two/copy_engines ;;
  w2-auto)
    mkdir -p $two
    python -m tilec calibrate -o $two/machine.json
    # a fresh auto cache: the auto row is the model's pick
    TILEC_MACHINE=$two/machine.json TILEC_CACHE=$(mktemp -d) torchrun --standalone --nproc-per-node 2 -m tilec bench \
      examples/ag_gemm.tile --shapes paper --iters 20 \
      --schedules auto,bsp,flags,flags+dma,fused-push,fused-push+dma,specialized --out $two/auto_pick
    python benchmarks/runs/auto_vs_best.py $two/auto_pick/*.json ;;
  *) echo "usage: $0 check|w1|calibrate|auto|w2|w2-auto" >&2; exit 2 ;;
esac
