# Device call A (carry [".gpu"]): unpack the carried wheels into /tmp/site-packages (kept while the machine stays warm), then a smoke campaign.
source bench/device/unpack.sh
set +e
# A small digits campaign with GPU resources: 4 trials of 0.25 GPU, 40 s. It checks the stack and Ray's GPU placement
# only: the digits seed is a CPU trainer (it never moves to a device), so its trials have no GPU peak by design.
# fashion.sh checks that trials really start CUDA.
timeout 150 python3 -m ralph_ray sandbox=none resources=gpu resources.gpu=0.25 resources.cpu=2 search.max_concurrent=4 \
  trial.budget_s=5 safeguards.campaign_time_s=40 paths.runs=/tmp/smoke/runs paths.kb=/tmp/smoke/kb run_id=smoke 2>&1 | tail -25
echo smoke rc=${PIPESTATUS[0]}
python3 - <<'PY'

from ralph_ray.kb import open_reader
con = open_reader("/tmp/smoke/kb")
print(con.execute("select status, count(*), avg(seconds), max(peak_gpu_mb) from trials group by status").fetchall())
PY
