# Device diagnosis (carry [".gpu", ".gpudiag"]): does a trial given a GPU start CUDA, cold and warm? Prints node.json and usage.json.
source bench/device/unpack.sh
set +e
for pre in unset empty; do python3 - $pre <<'PY' 2>&1 | tee -a $OUT/diag.txt
import os, sys
if sys.argv[1] == "empty": os.environ["CUDA_VISIBLE_DEVICES"] = ""
import torch
pid = os.fork()
if pid == 0:
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    print(f"parent CUDA_VISIBLE_DEVICES {sys.argv[1]} -> forked child with 0: available", torch.cuda.is_available(), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
PY
done
for warm in true false; do
  rm -rf /tmp/ralph_ray_trials
  timeout 60 python3 -m ralph_ray task=fashion data.root=$PWD/.gpudiag task.subsample=3000 sandbox=none resources=gpu resources.gpu=0.5 resources.cpu=2 search.max_concurrent=2 \
    trial.warm=$warm trial.budget_s=5 safeguards.campaign_time_s=20 agent=none paths.runs=/tmp/d$warm/runs \
    paths.kb=/tmp/d$warm/kb run_id=d$warm > $OUT/camp_$warm.log 2>&1
  echo "warm=$warm rc=$?" | tee -a $OUT/diag.txt
  for f in $(find /tmp/d$warm /tmp/ralph_ray_trials -name node.json 2>/dev/null | head -3); do
    d=$(dirname $f); echo "$d: $(python3 -c "import json;j=json.load(open('$f'));print(j['cuda_visible_devices'], j['gpu_ids'])") usage: $(cat $d/usage.json 2>/dev/null)" | tee -a $OUT/diag.txt
  done
done
