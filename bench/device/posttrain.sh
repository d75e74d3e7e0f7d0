# Device call B for issue 17 (carry [".gpupost"], right after call A `source bench/device/unpack.sh` with [".gpu"]):
# task=grpo on one GPU (bf16, GPU_GROUP_FACTOR x larger groups, chosen by the trainer from harness.device()), the seed
# and the best variant after a short campaign (bench/posttrain.py), results to $OUT as posttrain_gpu.{md,json}.
# .gpupost holds what the image lacks or has at another version (bench/device/pack.sh builds it): trl, datasets,
# multiprocess, dill, gguf and pyarrow, at this checkout's versions. First run 2026-11-26 on an H200: README, "On a GPU".
export PYTHONPATH=/tmp/site-packages:$PWD PYTHONUNBUFFERED=1 BENCH_RESULTS=$OUT
test -d /tmp/site-packages/ray || { echo "no /tmp/site-packages: the machine went back after call A"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-packages .gpupost/*.whl
python3 -m pip show transformers trl peft datasets pyarrow huggingface_hub 2>/dev/null | grep -E "^(Name|Version)"
python3 -c "import trl, peft, datasets, transformers, torch; print('posttrain stack ok, cuda', torch.cuda.is_available())" \
  || { echo "the post-training stack does not import: see the versions above (datasets needs pyarrow>=24)"; exit 4; }
CYCLES=${CYCLES:-5}
CAP_S=${CAP_S:-300}  # leaves room in a 600-s call for the install, the base policy's build (not carried) and the save
timeout $((CAP_S + 200)) python3 bench/posttrain.py $CYCLES $CAP_S resources=gpu sandbox=none \
  2>&1 | tee $OUT/posttrain.log | grep -v "^\s*trial " | tail -30
rc=${PIPESTATUS[0]}
echo "posttrain rc=$rc"
exit $rc
