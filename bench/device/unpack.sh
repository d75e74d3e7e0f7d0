# Sourced by setup.sh and diag.sh: unpack the carried stack (.gpu) into /tmp/site-packages, put it and the repo on
# PYTHONPATH, and show the machine and what imports.
set -e
# The folder's name must hold 'site-packages': dill (datasets' fingerprints) pickles a module found anywhere else
# by value, and task=grpo's Dataset.from_dict then fails ("Can't pickle <class 'MonthDayNano'>", 2026-11-26).
S=/tmp/site-packages; mkdir -p $S
# Once per machine and carried stack: a second script sourcing this (in the same call, or a later call while the
# machine stays warm) skips it, unless .gpu changed.
stack=$(ls -l .gpu | md5sum | cut -d' ' -f1)
if [ "$(cat $S/.unpacked 2>/dev/null)" != "$stack" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $S .gpu/*.whl
  for t in ray duckdb antlr; do tar xJf .gpu/$t.tar.xz -C $S; done
  echo $stack > $S/.unpacked
fi
export PYTHONPATH=$S:$PWD PYTHONUNBUFFERED=1
nvidia-smi -L; nproc; free -g | head -2; df -h /dev/shm | tail -1
python3 -c "import ray, duckdb, optuna, hydra, libcst, torch, ralph_ray; print('ray', ray.__version__, 'duckdb', duckdb.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
