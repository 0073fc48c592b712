# device call 10 (NOT RUN: device time ran out): NPROG compiled in again, recompiled when 2 programs/SM fit;
# re-times the GEMM and decode rows with the final code. Run it first next session.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 55 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --schedules fused-pull --iters 20 --no-tune > $OUT/ag_final.log 2>&1; tail -13 $OUT/ag_final.log; grep -o "programs_per_sm': [0-9]" $OUT/ag_final.log | sort | uniq -c
timeout 50 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-quick --schedules bsp,fused-push --iters 15 --no-tune > $OUT/decode_final.log 2>&1; tail -13 $OUT/decode_final.log
