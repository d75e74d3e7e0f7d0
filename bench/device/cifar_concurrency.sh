# Device call (carry [".gpu"]): does running CIFAR trials side by side on one GPU hide their starts? The seed cycle of
# 8 trials (no replicates, FIFO: every trial its 12 epochs), 1, 2 and 4 at a time (gpu 1, 0.5, 0.25 each), on
# CIFAR-shaped synthetic data (CIFAR-10 can't be reached from the device: a speed figure only). Per layout: the
# cycle's training wall (first trial's start to last trial's record), the trials' median wall / epochs' time, and
# what a trial costs the campaign (training wall / 8) over a trial's epochs' time when it runs alone.
source bench/device/unpack.sh
set +e
bash bench/device/cifar_data.sh
for n in 1 2 4; do
  gpu=$(python3 -c "print(1 / $n)")
  timeout 110 python3 -m ralph_ray +experiment=cifar10 data.root=/tmp/cifar sandbox=none agent=none \
    population.mode=generations safeguards.max_cycles=1 safeguards.replicates=0 search.num_samples=8 \
    search.max_concurrent=$n scheduler=fifo resources.gpu=$gpu resources.cpu=$((16 / n < 8 ? 16 / n : 8)) \
    paths.runs=/tmp/cc$n/runs paths.kb=/tmp/cc$n/kb run_id=cc$n > $OUT/concurrency_$n.log 2>&1
  echo "$n at a time: campaign rc=$?"
done
python3 - <<'PY' | tee $OUT/cifar_concurrency.txt
import statistics
from ralph_ray.kb import open_reader
solo = None
print("at a time | trials | training wall s | median trial wall s | median epochs' time s | median wall/epochs | wall per trial / solo epochs' time")
for n in (1, 2, 4):
    con = open_reader(f"/tmp/cc{n}/kb")
    rows = con.execute("""select t.trial_id, epoch(t.written_at) as ended, t.seconds, sum(e.value) as epochs_s
      from trials t join epochs e using (run_id, trial_id) where e.metric = 'epoch_seconds' and t.status = 'completed'
      group by all""").fetchall()
    if not rows:
        print(n, "no completed trial"); continue
    wall = max(r[1] for r in rows) - min(r[1] - r[2] for r in rows)
    epochs = statistics.median(r[3] for r in rows)
    solo = epochs if n == 1 else solo
    ratio = statistics.median(r[2] / r[3] for r in rows)
    print(n, len(rows), round(wall, 2), round(statistics.median(r[2] for r in rows), 2), round(epochs, 3),
          round(ratio, 2), round(wall / len(rows) / solo, 2) if solo else None, sep=" | ")
PY
