# Device call (carry [".gpu"]): issue 13's GPU figures in one call, on CIFAR-shaped synthetic data (CIFAR-10 can't
# be reached from the device: a speed figure only). Results to $OUT (4 files).
#   1. the floor a fresh GPU process pays whatever it trains (bench/device/cuda_floor.py);
#   2. the seed trainer's start, step by step (bench/device/cifar_start.py, cuDNN autotuning off, as the trainer);
#   3. trial phases through the runner, no Ray (bench/device/phases.sh);
#   4. the campaign figure (bench/device/cifar_speed.sh: 4 trials + 3 replicates one at a time, trial wall / epochs).
source bench/device/unpack.sh
set +e
export BENCH_RESULTS=$OUT
nvidia-smi --query-gpu=name,persistence_mode,driver_version --format=csv
bash bench/device/cifar_data.sh
timeout 90 python3 bench/device/cuda_floor.py 5
CUDNN_BENCHMARK=0 timeout 60 python3 bench/device/cifar_start.py -- +experiment=cifar10 data.root=/tmp/cifar 2>&1 | tail -16
PHASES_TIMEOUT=100 PHASES_NAME=trial_phases_cifar_gpu_1130 bash bench/device/phases.sh 2>&1 | tail -13
CIFAR_TIMEOUT=150 bash bench/device/cifar_speed.sh
