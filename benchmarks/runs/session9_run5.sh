python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
D="-D B=1 -D HKV=12 -D G=8 -D D=128 -D S=65536 -D BS=4096"
timeout 250 python3 -m tilec taxes examples/flash_decode.tile --world 1 $D --measure --timeline > $OUT/fd64k_fold.log 2>&1
TILEC_FOLD=0 timeout 250 python3 -m tilec taxes examples/flash_decode.tile --world 1 $D --measure --timeline > $OUT/fd64k_nofold.log 2>&1
sed -n '/measured inside/,$p' $OUT/fd64k_fold.log $OUT/fd64k_nofold.log | grep -v "^bsp\|^flags\|k[0-9]_" 
