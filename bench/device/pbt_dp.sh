# Device call B (carry [".gpudata"], right after call A `source bench/device/unpack.sh`): on one GPU with the real
# Fashion-MNIST files, PBT against ASHA at the same wall budget (bench/pbt_vs_asha.py), then one trial plain against
# the same trial as a Ray Train group of one (NCCL, DDP: bench/dp_scaling.py). Results to $OUT.
export PYTHONPATH=/tmp/site-packages:$PWD PYTHONUNBUFFERED=1 BENCH_RESULTS=$OUT
test -d /tmp/site-packages/ray || { echo "no /tmp/site-packages: the machine went back after call A"; exit 3; }
mkdir -p /tmp/fm && tar xJf .gpudata/fm.tar.xz -C /tmp/fm && gzip -1 -f /tmp/fm/*-ubyte && ls /tmp/fm
BUDGET_S=${BUDGET_S:-90}
EPOCHS=${EPOCHS:-20}
COMMON="resources=gpu sandbox=none data.root=/tmp/fm"
timeout $((3 * BUDGET_S + 120)) python3 bench/pbt_vs_asha.py --task fashion --epochs $EPOCHS --budget-s $BUDGET_S \
  --cpus 16 --gpus 1 --asha-slots 4 --name pbt_vs_asha_fashion_gpu \
  --note "One H100 (16 cores), the real Fashion-MNIST files; one seed, one cycle per kind; ASHA 4 trials at a time \
(0.25 GPU, 4 CPUs each), PBT populations of 4 (0.25 GPU each) and 8 (0.125 GPU, 2 CPUs each)." \
  -- $COMMON 2>&1 | tee $OUT/pbt.log | grep -v "^\s*trial " | tail -25
echo "pbt rc=${PIPESTATUS[0]}"
timeout ${DP_TIMEOUT:-140} python3 bench/dp_scaling.py --task fashion --runs plain,one --epochs 8 --cpus 16 \
  --name dp_scaling_gpu --note "One Fashion-MNIST trial (real files), seed knobs, 8 epochs, one H100: a plain \
single trial against the same trial as a Ray Train group of one (resources.ray_train=true: NCCL process group, DDP)." \
  -- $COMMON resources.gpu=1 resources.cpu=8 2>&1 | tee $OUT/dp.log | grep -v "^\s*trial " | tail -15
echo "dp rc=${PIPESTATUS[0]}"
