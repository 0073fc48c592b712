# device call x2d (session 6) on `nvidia-h200-x2`: flash decode decode-paper at world 2 (bsp, fused-push, their graph
# rows beside NCCL's local kernel + all_gather_into_tensor + combine), with PDL and the cold-L2 timer. Multicast off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 420 torchrun --standalone --nproc-per-node 2 -m tilec bench examples/flash_decode.tile --shapes decode-paper --schedules bsp,fused-push --iters 10 --no-tune > $OUT/bench_decode_x2.txt 2>&1; tail -75 $OUT/bench_decode_x2.txt | cut -c1-150
for f in json png; do cp benchmarks/results/h200-x2/flash_decode_decode-paper_bf16.$f $OUT/decode_x2.$f; done
