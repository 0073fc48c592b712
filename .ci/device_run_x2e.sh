# device call x2e (session 6) on `nvidia-h200-x2`: GEMM + Reduce-Scatter and GEMM + All-Reduce, paper shapes, world 2,
# every tilec schedule beside NCCL (reduce_scatter_tensor / all_reduce after cuBLAS) and fused_matmul_reduce_scatter.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
for ex in gemm_rs gemm_ar; do
  timeout 170 torchrun --standalone --nproc-per-node 2 -m tilec bench examples/$ex.tile --shapes paper --iters 10 --no-tune > $OUT/bench_${ex}_x2.txt 2>&1; grep -v "^\[" $OUT/bench_${ex}_x2.txt | tail -32 | cut -c1-170
  for f in json png; do cp "benchmarks/results/h200-x2/${ex}_paper_bf16.$f" $OUT/${ex}_x2.$f; done
done
