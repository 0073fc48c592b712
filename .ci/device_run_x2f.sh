# device call x2f (session 6) on `nvidia-h200-x2`: the world-2 GPU tests, one rank per GPU, with programmatic
# dependent launch on (ag_gemm every schedule, flash decode bf16, captures, gemm_rs / gemm_ar). Multicast off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 230 python3 -m pytest -m gpu -q -rf tests/gpu -k "(all_schedules and 2) or (flash_decode_on_gpu and bf16-2) or captured or (reductions and 2)" > $OUT/gpu_tests_x2b.txt 2>&1; tail -5 $OUT/gpu_tests_x2b.txt
