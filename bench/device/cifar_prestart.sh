# Device call (carry [".gpu"]): trainers forked ahead (`trial.prestart`) on a GPU, side by side in one call.
#   1. bench/device/prestart_check.py: a handed-over trainer starts with CUDA up (and what its first op costs);
#   2. the CIFAR-10 campaign figure (bench/device/cifar_speed.sh: 4 trials + 3 replicates one at a time, trial wall /
#      epochs' time) with trial.prestart=false, then =true, on CIFAR-shaped synthetic data (a speed figure only).
source bench/device/unpack.sh
set +e
export BENCH_RESULTS=$OUT
nvidia-smi --query-gpu=name,persistence_mode,driver_version --format=csv
bash bench/device/cifar_data.sh
timeout 90 python3 bench/device/prestart_check.py 2>&1 | tail -12
CIFAR_TIMEOUT=150 CIFAR_TAG=_off CIFAR_ARGS=trial.prestart=false bash bench/device/cifar_speed.sh
CIFAR_TIMEOUT=150 CIFAR_TAG=_on CIFAR_ARGS=trial.prestart=true bash bench/device/cifar_speed.sh
