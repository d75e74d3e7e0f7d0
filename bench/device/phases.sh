# Device call (carry [".gpu"]): where a CIFAR-10 seed trial's wall time goes on one GPU, outside Ray
# (bench/trial_phases.py: start, epochs, between, end), on CIFAR-shaped synthetic data. Results to $OUT.
source bench/device/unpack.sh
set +e
export BENCH_RESULTS=$OUT
bash bench/device/cifar_data.sh
timeout ${PHASES_TIMEOUT:-240} python3 bench/trial_phases.py --trials ${TRIALS:-5} --threads 8 --name ${PHASES_NAME:-trial_phases_cifar_gpu} \
  --note "CIFAR-10 seed trainer on **CIFAR-shaped synthetic data** (CIFAR-10 can't be reached from the device): a speed \
figure only. One GPU ($(nvidia-smi -L | head -1 | cut -d'(' -f1))." -- +experiment=cifar10 data.root=/tmp/cifar sandbox=none
echo "phases rc=$?"
