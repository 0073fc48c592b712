# device call 3: GPU tests (1 and 2 ranks on one H200), then the paper+square bench with the tuned-first config
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 120 python3 -m pytest -m gpu -q "tests/gpu/test_gpu_ag_gemm.py::test_ag_gemm_all_schedules[1]" "tests/gpu/test_gpu_ag_gemm.py::test_ag_gemm_all_schedules[2]" tests/runtime/test_iris_gpu.py 2>&1 | tail -6 | tee $OUT/gpu_tests.log
timeout 240 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --iters 15 --no-tune 2>&1 | tee $OUT/bench.log
cp benchmarks/results/h200-1gpu/ag_gemm_paper+square_bf16.json $OUT/bench_paper.json
cp benchmarks/results/h200-1gpu/ag_gemm_paper+square_bf16.png $OUT/bench_paper.png
