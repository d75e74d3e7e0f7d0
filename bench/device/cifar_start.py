"""Split the CIFAR-10 seed trainer's start on a GPU into its steps (device diagnostic; prints, writes nothing).

Imports the seed trainer as a module and times, in a fresh process that has already imported what a warm trial's
server preloads (`warmstart.PRELOAD`): CUDA's start, the data load, the data to the device, the model, the
whitening init, the optimizer, the warm-up (twice: the second shows the steady cost once cuDNN has tuned), the
final test-time-augmented predictions.
    CUDNN_BENCHMARK=0|1 python bench/device/cifar_start.py -- +experiment=cifar10 data.root=/tmp/cifar
"""

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import config  # noqa: E402

from ralph_ray import warmstart  # noqa: E402
from ralph_ray.rundir import write_data  # noqa: E402
from ralph_ray.tasks import prepare_splits  # noqa: E402

for module in warmstart.PRELOAD:
    importlib.import_module(module)
root = Path(tempfile.mkdtemp(prefix="cifar-start-"))
cfg = config(root, "start", *[a for a in sys.argv[1:] if a != "--"])
write_data(prepare_splits(cfg), root, cfg.task.name)
os.environ["RALPH_DATA_DIR"] = str(root / "data")
spec = importlib.util.spec_from_file_location("train", cfg.seed_entry())
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
from ralph_ray import harness  # noqa: E402

marks = [("begin", time.perf_counter())]


def mark(name: str) -> None:
    torch.cuda.synchronize()
    marks.append((name, time.perf_counter()))


torch.zeros(1, device="cuda").add_(1)
mark("CUDA start")
data = harness.load_data()
mark("load_data (mmap)")
x_all = train.to_tensor(data.train_x, "cuda")
y_all = torch.tensor(data.train_y, device="cuda")
mark("train split to the device")
model = train.Net(data.num_classes).to("cuda").to(memory_format=torch.channels_last)
mark("model built")
model.init_whiten(x_all[:5000])
mark("init_whiten (eigh)")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.85, nesterov=True)
mark("optimizer")
autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
torch.backends.cudnn.benchmark = os.environ.get("CUDNN_BENCHMARK", "1") == "1"
x, y, x_val = x_all[:1024], y_all[:1024], x_all[-900:]
train.warm_up(model, optimizer, x, y, x_val, autocast)
mark("warm_up (first: autotuning)")
train.warm_up(model, optimizer, x, y, x_val, autocast)
mark("warm_up (second: steady)")
for split in (data.selection_x, data.test_x):
    train.logits_tta(model, train.to_tensor(split, "cuda"), autocast).argmax(1).cpu()
mark("selection + test predictions (TTA)")
for (_, a), (name, b) in zip(marks, marks[1:]):
    print(f"{name:40s} {b - a:7.3f} s")
print(f"{'total':40s} {marks[-1][1] - marks[0][1]:7.3f} s")
