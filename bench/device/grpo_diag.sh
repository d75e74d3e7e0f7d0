# Device check for task=grpo's trainer alone (carry [".gpupost"] and data/prepared/grpo from
# `python -m ralph_ray.prepare task=grpo`): one short run on the GPU and one on the CPU, no Ray, no engine; the
# traceback's frames outside the pickler are shown when one fails.
R=$PWD
export PYTHONUNBUFFERED=1 RALPH_DATA_DIR=$R/data/prepared/grpo PYTHONPATH=/tmp/site-packages:$R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-packages .gpupost/*.whl
python3 -m pip show pandas numpy dill xxhash fsspec 2>/dev/null | grep -E "^(Name|Version)" | paste - - | tr '\n' ' '; echo
rm -rf /tmp/g && cp -r trainers/grpo /tmp/g && cd /tmp/g
sed -i 's/^EPOCHS = 3/EPOCHS = 1/; s/^STEPS_PER_EPOCH = 8/STEPS_PER_EPOCH = 2/' train.py
for dev in gpu cpu; do
  if [ $dev = cpu ]; then export CUDA_VISIBLE_DEVICES=; fi
  timeout 150 python3 train.py > $dev.log 2>&1; echo "$dev rc=$?"
  grep -v "pickle.py\|_dill.py\|^\s*\^\|Call unbound\|StockPickler\|dill.Pickler\|save(\|save_\|self.save\|f(self, obj)" $dev.log | grep -v "^\s*$" | head -40
  cp $dev.log $OUT/ 2>/dev/null
done
