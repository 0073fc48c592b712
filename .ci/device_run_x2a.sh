# Issue 7, first call on `nvidia-h200-x2` (prepared in session 3, not run yet): GPU tests across both GPUs, then the
# All-Gather + GEMM bench, every schedule beside NCCL + cuBLAS and PyTorch async-TP. NVLink multicast stays off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import torch; print("GPUs:", torch.cuda.device_count())'; nvidia-smi topo -m | head -5
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 300 python3 -m pytest -m gpu -q -rf tests/gpu > $OUT/gpu_tests_x2.txt 2>&1; tail -6 $OUT/gpu_tests_x2.txt
timeout 240 torchrun --standalone --nproc-per-node 2 -m tilec bench examples/ag_gemm.tile --shapes paper,square --iters 10 --no-tune > $OUT/bench_ag_x2.txt 2>&1; tail -40 $OUT/bench_ag_x2.txt
for f in json png; do cp "benchmarks/results/h200-x2/ag_gemm_paper+square_bf16.$f" $OUT/ag_x2.$f; done
