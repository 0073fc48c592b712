# device call 28 (session 5): final decode-paper after [keys, D] loads (v fed from shared memory, no re-mask) and a default_bs that counts a saturating last
# wave: flash decode GPU tests (bf16 world 1/2, captures), then decode-paper (bsp, fused-push, graph rows, SDPA).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 150 python3 -m pytest -m gpu -q -rf tests/gpu -k "(flash_decode_on_gpu and (bf16-1 or bf16-2)) or (captured and flash)" > $OUT/gpu_tests13.txt 2>&1; tail -4 $OUT/gpu_tests13.txt
timeout 400 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-paper --schedules bsp,fused-push --iters 15 --no-tune > $OUT/bench_decode.txt 2>&1; tail -74 $OUT/bench_decode.txt | cut -c1-150
for f in json png; do cp benchmarks/results/h200-1gpu/flash_decode_decode-paper_bf16.$f $OUT/decode_paper.$f; done
