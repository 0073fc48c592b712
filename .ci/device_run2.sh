# device call 2: kernel-only GEMM probe, the paper bench again (tuned), GPU tests
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
export RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29561
timeout 150 python3 benchmarks/gemm_kernel_probe.py 2>&1 | grep -v Warn | tee $OUT/probe.log
unset RANK WORLD_SIZE LOCAL_RANK
timeout 300 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --iters 10 2>&1 | tee $OUT/bench.log
cp benchmarks/results/h200-1gpu/ag_gemm_paper+square_bf16.json $OUT/bench_paper.json
cp benchmarks/results/h200-1gpu/ag_gemm_paper+square_bf16.png $OUT/bench_paper.png
timeout 150 python3 -m pytest -m gpu -x -q "tests/gpu/test_gpu_ag_gemm.py::test_ag_gemm_all_schedules[1]" "tests/gpu/test_gpu_ag_gemm.py::test_ag_gemm_all_schedules[2]" tests/runtime/test_iris_gpu.py 2>&1 | tail -15 | tee $OUT/gpu_tests.log
