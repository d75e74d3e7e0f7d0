# Device call B (carry [".gpudata"], right after call A): the Fashion-MNIST data, then bench/fashion.py on one GPU (results to $OUT).
export PYTHONPATH=/tmp/site-packages:$PWD PYTHONUNBUFFERED=1 BENCH_RESULTS=$OUT
test -d /tmp/site-packages/ray || { echo "no /tmp/site-packages: the machine went back after call A"; exit 3; }
mkdir -p /tmp/fm && tar xJf .gpudata/fm.tar.xz -C /tmp/fm && gzip -1 -f /tmp/fm/*-ubyte && ls -la /tmp/fm
CAMPAIGN_S=${CAMPAIGN_S:-440}
# First a 20-s campaign on a 3,000-image subsample: every trial given a GPU must record a GPU peak (the harness writes
# peak_gpu_mb to usage.json once CUDA started), else the figure would be a CPU figure: stop and show why.
timeout 70 python3 -m ralph_ray task=fashion data.root=/tmp/fm task.subsample=3000 sandbox=none resources=gpu \
  resources.gpu=0.5 resources.cpu=2 search.max_concurrent=2 trial.budget_s=5 safeguards.campaign_time_s=20 agent=none \
  paths.runs=/tmp/q/runs paths.kb=/tmp/q/kb run_id=q > $OUT/gpu_check.log 2>&1
usage=$(find /tmp/q -name usage.json); echo "$usage" | xargs cat; echo
if [ -z "$usage" ] || grep -L peak_gpu_mb $usage | grep -q .; then
  echo "a trial given a GPU has no GPU peak: not running the figure"; tail -30 $OUT/gpu_check.log; exit 4
fi
timeout $((CAMPAIGN_S + 100)) python3 bench/fashion.py --campaign-s $CAMPAIGN_S --trial-s 30 --slots 4 --seeds 0 \
  --parallel --stagger-s 10 --knob-samples 4 --name fashion_gpu -- resources=gpu resources.gpu=0.25 resources.cpu=2 \
  sandbox=none data.root=/tmp/fm 2>&1 | tee $OUT/bench.log | grep -v "^\s*trial " | tail -60
for d in /tmp/bench-fashion-*/*/; do tail -c 3000 $d/campaign.log > $OUT/$(basename $d).log; done
# Per trial: epochs, training seconds per epoch and GPU peak (why a figure is what it is; kept under $OUT).
for kb in /tmp/bench-fashion-*/*/kb; do python3 - "$kb" <<'PY' > $OUT/$(basename $(dirname $kb))_trials.txt
import sys
from ralph_ray.kb import open_reader
con = open_reader(sys.argv[1])
print('status, trials, mean GPU peak MiB (per epoch row), trials with a GPU peak, median epoch s, max epoch')
print(con.execute("""select t.status, count(distinct t.trial_id), avg(t.peak_gpu_mb),
  count(distinct t.trial_id) filter (where t.peak_gpu_mb is not null),
  median(e.value) filter (where e.metric = 'epoch_seconds'), max(e.epoch)
  from trials t left join epochs e using (run_id, trial_id) group by t.status""").fetchall())
PY
done
