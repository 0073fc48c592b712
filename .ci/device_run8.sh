# device call 8: occupancy-sized persistent grids (2 programs/SM where they fit), NPROG a runtime argument.
# GPU tests touched by it, the decode-paper bench (bsp vs the single persistent kernel), taxes, ag_gemm re-check.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 85 python3 -m pytest -m gpu -q -rf tests/gpu -k "many_calls or (flash and bf16-2)" > $OUT/gpu_tests3.log 2>&1; tail -4 $OUT/gpu_tests3.log
timeout 300 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-paper --schedules bsp,fused-push --iters 15 --no-tune > $OUT/bench_decode_paper.log 2>&1
tail -42 $OUT/bench_decode_paper.log
cp benchmarks/results/h200-1gpu/flash_decode_decode-paper_bf16.* $OUT/ 2>/dev/null
timeout 60 python3 -m tilec taxes examples/ag_gemm.tile --world 1 -D M=8192 -D N=8192 -D K=8192 -D BM=128 -D BN=256 -D BK=64 --num-warps 8 --measure > $OUT/taxes_measure2.log 2>&1; tail -16 $OUT/taxes_measure2.log
timeout 60 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --schedules fused-pull --iters 15 --no-tune > $OUT/bench_ag2.log 2>&1; tail -14 $OUT/bench_ag2.log
