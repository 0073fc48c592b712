# Issue 7, second call on `nvidia-h200-x2` (prepared in session 3, not run yet): GEMM + RS / AR beside NCCL
# (reduce_scatter_tensor, all_reduce) and fused_matmul_reduce_scatter, and flash decode beside NCCL + torch.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
for ex in gemm_rs gemm_ar; do
  timeout 150 torchrun --standalone --nproc-per-node 2 -m tilec bench examples/$ex.tile --shapes paper,square --iters 10 --no-tune > $OUT/bench_${ex}_x2.txt 2>&1; tail -30 $OUT/bench_${ex}_x2.txt
  for f in json png; do cp "benchmarks/results/h200-x2/${ex}_paper+square_bf16.$f" $OUT/${ex}_x2.$f; done
done
timeout 280 torchrun --standalone --nproc-per-node 2 -m tilec bench examples/flash_decode.tile --shapes decode-paper --schedules bsp,fused-push --iters 10 --no-tune > $OUT/bench_decode_x2.txt 2>&1; tail -45 $OUT/bench_decode_x2.txt
for f in json png; do cp benchmarks/results/h200-x2/flash_decode_decode-paper_bf16.$f $OUT/decode_x2.$f; done
