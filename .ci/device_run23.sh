# device call 23 (session 5): the flat (task, key block) loop probe for the split stage; then the GPU tests of the
# changes of session 4 that never ran on a GPU (tile-aligned reads keep scalar waits, wait_plan refactor, the shared
# _tilec_timed_out helper): flash decode bf16 world 1/2/4, captures, ag_gemm world 2, gemm_rs/gemm_ar world 2.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 250 python3 benchmarks/decode_flat_probe.py > $OUT/decode_flat_probe.log 2>&1; cat $OUT/decode_flat_probe.log | cut -c1-200
timeout 300 python3 -m pytest -m gpu -q -rf tests/gpu -k "(flash_decode_on_gpu and bf16) or captured or (ag_gemm_all and 2) or (gemm_reductions and 2)" > $OUT/gpu_tests10.txt 2>&1; tail -15 $OUT/gpu_tests10.txt
