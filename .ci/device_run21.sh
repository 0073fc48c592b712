# device call 21 (session 4): calls recorded as CUDA graphs (CompiledProgram.capture; the kernels read the epoch
# on the device): the GPU tests of replays, then decode-paper with a "(CUDA graph)" row beside each capturable
# schedule.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 150 python3 -m pytest -m gpu -q -rf tests/gpu -k "captured or (flash and bf16-1)" > $OUT/gpu_tests8.txt 2>&1; tail -15 $OUT/gpu_tests8.txt
timeout 330 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-paper --schedules bsp,fused-push --iters 15 --no-tune > $OUT/bench_decode.txt 2>&1; tail -74 $OUT/bench_decode.txt | cut -c1-150
for f in json png; do cp benchmarks/results/h200-1gpu/flash_decode_decode-paper_bf16.$f $OUT/decode_paper.$f; done
