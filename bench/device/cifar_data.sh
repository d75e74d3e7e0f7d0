# CIFAR-shaped synthetic data in /tmp/cifar (CIFAR-10 can't be reached from the device): random uint8 images and
# random labels in the real python-batch format, for speed figures only (their accuracy means nothing).
# Made once per machine: a second script needing it in the same call finds it there.
test -f /tmp/cifar/cifar-10-batches-py/test_batch && exit 0
mkdir -p /tmp/cifar/cifar-10-batches-py && python3 - <<'PY'
import pickle
import numpy as np
rng = np.random.default_rng(0)
for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
    batch = {b"data": rng.integers(0, 256, (10000, 3072), dtype=np.uint8), b"labels": rng.integers(0, 10, 10000).tolist()}
    with open(f"/tmp/cifar/cifar-10-batches-py/{name}", "wb") as handle:
        pickle.dump(batch, handle)
PY
