# Device call (carry [".gpu"]): the CIFAR-10 seed trial's wall / its epochs' time on one GPU (issue: warm starts).
# CIFAR-10 can't be reached from the device, so the batches are CIFAR-shaped synthetic data (random uint8 images,
# random labels, the real file format): a speed figure only, its accuracy means nothing.
# CIFAR_ARGS: more overrides; CIFAR_TAG: a suffix for its KB, log and table (side-by-side runs in one call).
source bench/device/unpack.sh
set +e
bash bench/device/cifar_data.sh
# One seed cycle of 4 trials one after another on the whole GPU, no early stops (each trial its 12 epochs).
timeout ${CIFAR_TIMEOUT:-220} python3 -m ralph_ray +experiment=cifar10 data.root=/tmp/cifar sandbox=none agent=none \
  population.mode=generations safeguards.max_cycles=1 search.num_samples=4 search.max_concurrent=1 scheduler=fifo \
  resources.gpu=1 resources.cpu=8 paths.runs=/tmp/c$CIFAR_TAG/runs paths.kb=/tmp/c$CIFAR_TAG/kb run_id=c $CIFAR_ARGS \
  > $OUT/cifar$CIFAR_TAG.log 2>&1
echo "campaign rc=$?"; tail -15 $OUT/cifar$CIFAR_TAG.log
CIFAR_TAG=$CIFAR_TAG python3 - <<'PY' | tee $OUT/cifar_speed$CIFAR_TAG.txt
import os
from ralph_ray.kb import open_reader
con = open_reader(f"/tmp/c{os.environ['CIFAR_TAG']}/kb")
rows = con.execute("""select t.trial_id, t.status, t.seconds, t.epochs, sum(e.value), min(e.value), max(e.value),
  t.peak_gpu_mb, min(t.written_at) as written from trials t join epochs e using (run_id, trial_id)
  where e.metric = 'epoch_seconds' group by all order by written""").fetchall()
print("trial, status, trial wall s, epochs, epochs' time s, fastest / slowest epoch s, GPU peak MiB, wall / epochs' time")
for r in rows:
    print(*r[:8], round(r[2] / r[4], 2) if r[2] and r[4] else None)
PY
