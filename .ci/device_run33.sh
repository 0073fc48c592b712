# device call 33 (session 6): the gpu_time tests after event_time was split out of cold_time, and tilec calibrate
# (its copy now timed by cold_time).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 60 python3 -m pytest -m gpu -q -rf tests/gpu/test_gpu_time.py 2>&1 | tail -2
timeout 80 python3 -m tilec calibrate -o $OUT/machine.json 2>&1 | tail -8
