# Device call (carry [".gpu"]): issue 13's GPU figures in one call, on CIFAR-shaped synthetic data (CIFAR-10 can't
# be reached from the device: a speed figure only). Results to $OUT (6 files).
#   1. the fork server's cuDNN opening alone (zygote.open_cudnn_libraries: which libraries, how long);
#   2. the start's steps (bench/device/cifar_start.py, cuDNN autotuning off: the trainer's setting);
#   3. trial phases through the runner (bench/trial_phases.py), the server's cuDNN opening off, then on;
#   4. the campaign figure (bench/device/cifar_speed.sh: 4 trials + 3 replicates one at a time, trial wall / epochs).
source bench/device/unpack.sh
set +e
export BENCH_RESULTS=$OUT
bash bench/device/cifar_data.sh
python3 -c "
import os, time, torch
from ralph_ray import zygote
began = time.perf_counter(); opened = zygote.open_cudnn_libraries()
print('the server opens', len(opened), 'cuDNN libraries in', round(time.perf_counter() - began, 3), 's:', *map(os.path.basename, opened))"
CUDNN_BENCHMARK=0 timeout 60 python3 bench/device/cifar_start.py -- +experiment=cifar10 data.root=/tmp/cifar 2>&1 | tail -16
card=$(nvidia-smi -L | head -1 | cut -d'(' -f1)
for libs in 0 1; do
  RALPH_WARM_CUDA_LIBS=$libs timeout 100 python3 bench/trial_phases.py --trials 5 --threads 8 \
    --name trial_phases_cifar_gpu_libs$libs --note "CIFAR-10 seed trainer (whitening's eigenproblem on the CPU), \
the fork server's cuDNN opening $([ $libs = 1 ] && echo on || echo off) (RALPH_WARM_CUDA_LIBS=$libs), on **CIFAR-shaped \
synthetic data** (CIFAR-10 can't be reached from the device): a speed figure only. One GPU ($card)." \
    -- +experiment=cifar10 data.root=/tmp/cifar sandbox=none 2>&1 | tail -12
done
CIFAR_TIMEOUT=150 bash bench/device/cifar_speed.sh
