"""The engine's frozen evaluation of an exported model: its outputs on the selection and test inputs.

Not imported by the engine: `ralph_ray.modeleval` copies this file into a fresh folder beside the trainer's
`model.pt2` and runs it there as `evaluate.py`, in the trial's sandbox (it sees that folder, the public data and
the harness, nothing the trainer wrote besides its model). Its outputs are saved as the trial's predictions, which
the driver scores with the task's frozen metric, so a trainer's own predictions and reported losses count for
nothing.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ralph_ray import harness

BATCH = 256  # inputs per forward pass


def outputs(module: torch.nn.Module, inputs: np.ndarray, like: torch.Tensor) -> np.ndarray:
    """The model's outputs for `inputs`, in batches; a model exported with a fixed batch size gets padded batches."""
    try:
        return _outputs(module, inputs, like, BATCH, pad=False)
    except Exception:  # noqa: BLE001 - the export fixed the batch size (its example's): evaluate at that size
        return _outputs(module, inputs, like, int(like.shape[0]), pad=True)


def _outputs(module: torch.nn.Module, inputs: np.ndarray, like: torch.Tensor, size: int, pad: bool) -> np.ndarray:
    rows = []
    with torch.no_grad():
        for start in range(0, len(inputs), size):
            chunk = np.asarray(inputs[start : start + size])
            real = len(chunk)
            if pad and real < size:
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], size - real, axis=0)])
            x = torch.as_tensor(chunk).to(dtype=like.dtype, device=like.device)
            rows.append(module(x)[:real].detach().float().cpu().numpy())
    return np.concatenate(rows)


def main() -> None:
    start = time.perf_counter()
    program = torch.export.load(harness.MODEL_FILE)
    like = program.example_inputs[0][0]
    module = program.module()
    data = harness.load_data()
    selection, test = outputs(module, data.selection_x, like), outputs(module, data.test_x, like)
    harness.report(epoch=1, eval_seconds=time.perf_counter() - start)
    harness.save_predictions(selection=selection, test=test)


if __name__ == "__main__":
    main()
