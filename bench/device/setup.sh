# Device call A (carry [".gpu"]): unpack the carried wheels into /tmp/site (kept while the machine stays warm), then a smoke campaign.
set -e
S=/tmp/site; mkdir -p $S
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $S .gpu/*.whl
for t in ray duckdb antlr; do tar xJf .gpu/$t.tar.xz -C $S; done
export PYTHONPATH=$S:$PWD PYTHONUNBUFFERED=1
nvidia-smi -L; nproc; free -g | head -2; df -h /dev/shm | tail -1
python3 -c "import ray, duckdb, optuna, hydra, libcst, torch, ralph_ray; print('ray', ray.__version__, 'duckdb', duckdb.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
set +e
# A small digits campaign on the GPU: 4 trials of 0.25 GPU, 40 s.
timeout 150 python3 -m ralph_ray sandbox=none resources=gpu resources.gpu=0.25 resources.cpu=2 search.max_concurrent=4 \
  trial.budget_s=5 safeguards.campaign_time_s=40 paths.runs=/tmp/smoke/runs paths.kb=/tmp/smoke/kb run_id=smoke 2>&1 | tail -25
echo smoke rc=${PIPESTATUS[0]}
python3 - <<'PY'
import duckdb, glob
from ralph_ray.kb import open_reader
con = open_reader("/tmp/smoke/kb")
print(con.execute("select status, count(*), avg(seconds), max(peak_gpu_mb) from trials group by status").fetchall())
PY
