# Issue 7 on `nvidia-h200-x2`, lent late in session 5 with ~7 min of device time left: the All-Gather + GEMM paper
# shapes (every schedule beside NCCL + cuBLAS and async-TP), flash decode decode-quick (bsp, fused-push beside NCCL +
# torch), then the GPU tests at world 2 across both GPUs. NVLink multicast stays off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import torch; print("GPUs:", torch.cuda.device_count())'; nvidia-smi topo -m | head -4
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
mkdir -p $OUT/x2
timeout 150 torchrun --standalone --nproc-per-node 2 -m tilec bench examples/ag_gemm.tile --shapes paper --iters 10 --no-tune > $OUT/x2/bench_ag_x2.txt 2>&1; tail -30 $OUT/x2/bench_ag_x2.txt | cut -c1-160
cp -r benchmarks/results/h200-x* $OUT/x2/ 2>/dev/null; ls -R $OUT/x2 | head
timeout 110 torchrun --standalone --nproc-per-node 2 -m tilec bench examples/flash_decode.tile --shapes decode-quick --schedules bsp,fused-push --iters 10 --no-tune > $OUT/x2/bench_decode_x2.txt 2>&1; tail -25 $OUT/x2/bench_decode_x2.txt | cut -c1-160
cp -r benchmarks/results/h200-x* $OUT/x2/ 2>/dev/null
timeout 100 python3 -m pytest -m gpu -q -rf tests/gpu -k "2" > $OUT/x2/gpu_tests_x2.txt 2>&1; tail -6 $OUT/x2/gpu_tests_x2.txt
