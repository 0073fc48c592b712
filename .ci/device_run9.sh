# device call 9: does the occupancy-sized grid (2 programs/SM where they fit) change the GEMM? Same bench twice.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
for per in 2 1 2; do
  TILEC_PROGRAMS_PER_SM=$per timeout 80 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --schedules fused-pull --iters 20 --no-tune > $OUT/ag_per$per.log 2>&1
  echo "programs/SM cap $per"; tail -13 $OUT/ag_per$per.log
done
