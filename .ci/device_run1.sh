# device call 1: GPU smoke (tilec run on Iris, 1 and 2 ranks) + GEMM speed at world 1 (paper + square shapes)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
nvidia-smi -L
timeout 120 python3 -m tilec run examples/ag_gemm.tile --world 1 --backend iris 2>&1 | tee $OUT/run.log
timeout 150 python3 -m tilec run examples/ag_gemm.tile --world 2 --backend iris -D M=1000 -D N=520 -D K=264 2>&1 | tee -a $OUT/run.log
timeout 330 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --iters 10 2>&1 | tee $OUT/bench.log
cp benchmarks/results/*/* $OUT/ 2>/dev/null; ls -la $OUT
