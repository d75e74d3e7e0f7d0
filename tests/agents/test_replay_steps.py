"""Hard-example replay's extra steps are the trainer's own steps; the weight average's eval-mode line is added once.

A user trial (an AMP trainer that accumulates gradients) found the replay leaking its last gradient into the trainer's
next step, observing 1 batch of every ACCUM, stepping at 1/ACCUM of the training step's scale, and running its forward
outside the trainer's autocast and GradScaler. Each trainer here is a small digits script run in this process.
"""

from __future__ import annotations

import ast

import pytest
import torch
import torch.nn.functional as F
from test_transforms import count_calls  # the real runs' call counter, one copy

from ralph_ray.agents.transforms import NotApplicable, apply_transform

# A flat digits trainer that zeroes its gradients at the start of each epoch (before the replay's line) and after
# each step: the replay's last gradient, left in place, went into the first step of every epoch after the first.
ZERO_AT_EPOCH_START = """
import torch
import torch.nn.functional as F
from torch import nn
from sklearn.datasets import load_digits

LR = 0.05  # learning rate
EPOCHS = 3  # passes
ACCUM = 2  # micro-batches per optimizer step

digits = load_digits()
x = torch.tensor(digits.data[:256], dtype=torch.float32) / 16
y = torch.tensor(digits.target[:256])
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=LR)
steps = 0
for epoch in range(EPOCHS):
    opt.zero_grad()
    for i in range(0, len(x), 32):
        loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32])
        loss.backward()
        opt.step()
        opt.zero_grad()
        steps += 1
"""

# The same, its gradients accumulated over ACCUM micro-batches (the user's idiom): 8 batches, 4 steps an epoch.
ACCUMULATING = ZERO_AT_EPOCH_START.replace(
    """        loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32])
        loss.backward()
        opt.step()
        opt.zero_grad()
        steps += 1
""",
    """        loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32]) / ACCUM
        loss.backward()
        if (i // 32 + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad()
            steps += 1
""",
)

# The user's AMP form of it: the forward under autocast (bfloat16 runs on CPU), a GradScaler enabled (its loss
# scale real on CPU too), and the clip after `scaler.unscale_(opt)` inside the step's own condition.
SCALED = (
    ACCUMULATING.replace(
        "        loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32]) / ACCUM\n        loss.backward()\n",
        '        with torch.autocast("cpu", dtype=torch.bfloat16):\n'
        "            loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32]) / ACCUM\n"
        "        scaler.scale(loss).backward()\n",
    )
    .replace(
        "            opt.step()\n",
        "            scaler.unscale_(opt)\n"
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "            scaler.step(opt)\n"
        "            scaler.update()\n",
    )
    .replace("steps = 0\n", 'steps = 0\nscaler = torch.amp.GradScaler("cpu", enabled=True)\n')
)

# The same step after a guard that skips it (`if ...: continue`), the step's run at the batch loop's level.
GUARDED = ACCUMULATING.replace(
    """        if (i // 32 + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad()
            steps += 1
""",
    """        if (i // 32 + 1) % ACCUM != 0:
            continue
        opt.step()
        opt.zero_grad()
        steps += 1
""",
)

BATCHES = 8  # 256 examples in batches of 32: per epoch


def run(source: str) -> dict:
    """Run a transformed trainer in this process; its module namespace."""
    ran: dict = {"__name__": "train"}
    exec(compile(source, "train.py", "exec"), ran)
    return ran


def dream_call(source: str) -> ast.Call:
    """The `<replay>.dream(...)` call a transformed trainer makes."""
    return next(
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith(".dream")
    )


def test_no_replay_gradient_is_left_for_the_trainers_next_step():
    """The replay's last step left its gradient in place; a trainer that zeroes at the start of the epoch (before the
    replay) and after each step added it into the first step of every later epoch."""
    result = apply_transform("hard_example_replay", ZERO_AT_EPOCH_START)
    line = next(s for s in result.splitlines() if ".dream(" in s)
    indent = line[: len(line) - len(line.lstrip())]
    # what the trainer's first backward of the epoch adds to, recorded right after the replay
    probe = f"{indent}LEFT.append([p.grad for p in model.parameters() if p.grad is not None and p.grad.any()])"
    ran = run(result.replace(line, f"{line}\n{probe}").replace("steps = 0\n", "steps = 0\nLEFT = []\n", 1))
    assert len(ran["LEFT"]) == 3 and ran["steps"] == 3 * BATCHES
    assert ran["LEFT"] == [[], [], []]  # the first epoch has nothing to replay; the others left nothing either
    # the helper alone, on a tiny model: after dream() every gradient is gone, whatever the caller does next
    helper: dict = {"torch": torch, "REPLAY_SHARE": 0.5}
    exec(
        ast.get_source_segment(
            result, next(n for n in ast.parse(result).body if getattr(n, "name", "") == "DreamReplay")
        ),
        helper,
    )
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    replay, inputs, targets = helper["DreamReplay"](), torch.randn(8, 4), torch.randint(0, 3, (8,))
    replay.observe(model(inputs), inputs, targets)
    before = [p.detach().clone() for p in model.parameters()]
    replay.dream(model, opt)
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))  # it did step
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("source", [ACCUMULATING, GUARDED], ids=["conditional_step", "guarded_step"])
def test_replay_observes_every_micro_batch_of_an_accumulating_trainer(source: str):
    """`observe(...)` went after the step, inside `if (i + 1) % ACCUM == 0:` (or after a guard's `continue`): 1 batch
    of every ACCUM was ranked."""
    assert ("continue" in source) == (source is GUARDED)
    result = apply_transform("hard_example_replay", source)
    ran = run(result)
    assert ran["steps"] == 3 * BATCHES // 2
    # the buffer holds the last epoch's observations (its replay would be the next epoch's): one per batch
    assert len(ran["dream_replay"].y) == BATCHES


@pytest.mark.parametrize("source", [ACCUMULATING, GUARDED], ids=["conditional_step", "guarded_step"])
def test_replay_steps_carry_no_accumulation_divisor(source: str):
    """The replay reused `F.cross_entropy(...) / ACCUM` whole: each replay step, a full optimizer step, was taken at
    1/ACCUM of the training step's scale. A divisor the step's condition does not name stays (a summed loss's mean)."""
    result = apply_transform("hard_example_replay", source)
    loss = eval(
        ast.unparse(next(k.value for k in dream_call(result).keywords if k.arg == "loss")), {"F": F, "ACCUM": 2}
    )
    logits, targets = torch.randn(32, 10), torch.randint(0, 10, (32,))
    assert torch.allclose(loss(logits, targets), F.cross_entropy(logits, targets))
    summed = source.replace(
        "F.cross_entropy(model(x[i : i + 32]), y[i : i + 32]) / ACCUM",
        'F.cross_entropy(model(x[i : i + 32]), y[i : i + 32], reduction="sum") / 32 / ACCUM',
    )
    loss = eval(
        ast.unparse(
            next(
                k.value for k in dream_call(apply_transform("hard_example_replay", summed)).keywords if k.arg == "loss"
            )
        ),
        {"F": F, "ACCUM": 2},
    )
    assert torch.allclose(loss(logits, targets), F.cross_entropy(logits, targets))
    # a divisor that mixes the accumulation count with another factor cannot be split: refused, naming it
    mixed = summed.replace("/ 32 / ACCUM", "/ (32 * ACCUM)")
    with pytest.raises(NotApplicable, match=r"divided by `\(32 \* ACCUM\)`"):
        apply_transform("hard_example_replay", mixed)


def test_replay_steps_run_under_the_trainers_autocast_and_grad_scaler(monkeypatch: pytest.MonkeyPatch):
    """The replay's forward ran outside the trainer's `torch.autocast(...)` and its steps outside the GradScaler; the
    clip under the step's own `if (i + 1) % ACCUM == 0:` was refused as reading the batch loop's `i`."""
    result = apply_transform("hard_example_replay", SCALED)
    autocast: list[bool] = []
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: (
            autocast.append(torch.is_autocast_enabled("cpu")) if isinstance(module, torch.nn.Sequential) else None
        )
    )
    counts = count_calls(
        monkeypatch,
        sgd=(torch.optim.SGD, "step"),
        scaled=(torch.amp.GradScaler, "step"),
        updates=(torch.amp.GradScaler, "update"),
        clips=(torch.nn.utils, "clip_grad_norm_"),
    )
    try:
        ran = run(result)
    finally:
        hook.remove()
    trainer_steps = 3 * BATCHES // 2
    assert ran["steps"] == trainer_steps
    assert len(autocast) > 3 * BATCHES and all(autocast)  # the replay's forwards too
    assert counts["scaled"] > trainer_steps  # replay steps taken, through the scaler
    assert counts["sgd"] <= counts["scaled"] == counts["updates"] == counts["clips"]
    assert all(bool(p.isfinite().all()) for p in ran["model"].parameters())


def test_ema_adds_one_eval_line_after_the_models_own():
    """A model bound twice before training (`model = model.to(device)`) had each of its uses found once per binding:
    `ema.eval()` was added twice after `model.eval()`, beside the `.eval()` the average is built with."""
    source = ZERO_AT_EPOCH_START.replace("LR = 0.05", "LR = 0.5").replace(
        "opt = torch.optim.SGD", 'model = model.to("cpu")\nopt = torch.optim.SGD'
    ) + ("    model.eval()\n    with torch.no_grad():\n        accuracy = (model(x).argmax(1) == y).float().mean()\n")
    result = apply_transform("ema_weights", source)
    lines = [line.strip() for line in result.splitlines()]
    assert lines.count("ema.eval()") == 1 and lines[lines.index("model.eval()") + 1] == "ema.eval()"
    assert result.count(".eval()") == 3  # the model's own, the average's line, and the constructor's suffix
    assert "accuracy = (ema(x).argmax(1) == y).float().mean()" in lines
    assert run(result)["accuracy"] > 0.5  # the average predicts (chance: 0.1)


# A trainer whose step goes through a GradScaler but whose forward runs in full precision (no autocast yet): the
# mixed_precision intervention adds the autocast, the replay takes the scaler either way.
SCALER_ONLY = SCALED.replace(
    '        with torch.autocast("cpu", dtype=torch.bfloat16):\n'
    "            loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32]) / ACCUM\n",
    "        loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32]) / ACCUM\n",
)
# mixed_precision's autocast is CUDA's, disabled on CPU: run on CPU, the same context is CPU's, enabled
ON_CPU = (('device_type="cuda"', 'device_type="cpu"'), ("enabled=torch.cuda.is_available()", "enabled=True"))


@pytest.mark.parametrize("source", [ZERO_AT_EPOCH_START, SCALER_ONLY], ids=["plain", "grad_scaler"])
@pytest.mark.parametrize(
    "order",
    [["hard_example_replay", "mixed_precision"], ["mixed_precision", "hard_example_replay"]],
    ids=["replay_first", "mixed_precision_first"],
)
def test_replay_and_mixed_precision_compose_in_either_order(source: str, order: list[str]):
    """mixed_precision applied after hard_example_replay left the replay call without `autocast=`: its forwards ran
    in float32 beside the trainer's bfloat16 ones (only the other order passed it)."""
    result = source
    for name in order:
        result = apply_transform(name, result)
    keywords = {k.arg: ast.unparse(k.value) for k in dream_call(result).keywords}
    assert keywords["autocast"] == ast.unparse(
        ast.parse('lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_available())')
    )
    assert ("scaler" in keywords) == (source is SCALER_ONLY) and keywords.get("scaler", "scaler") == "scaler"
    for old, new in ON_CPU:
        result = result.replace(old, new)
    autocast: list[bool] = []
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: (
            autocast.append(torch.is_autocast_enabled("cpu")) if isinstance(module, torch.nn.Sequential) else None
        )
    )
    try:
        ran = run(result)
    finally:
        hook.remove()
    assert len(autocast) > 3 * BATCHES and all(autocast)  # the trainer's forwards and the replay's
    assert all(bool(p.isfinite().all()) for p in ran["model"].parameters())


STEP_IF = "        if (i // 32 + 1) % ACCUM == 0:\n"
# The other common ways to take the step once per ACCUM micro-batches (ACCUMULATING's `(i + 1) % ACCUM == 0` aside)
ACCUMULATION_IDIOMS = {
    "remainder_minus_one": ACCUMULATING.replace(STEP_IF, "        if (i // 32) % ACCUM == ACCUM - 1:\n"),
    "counter": ACCUMULATING.replace("steps = 0\n", "steps = 0\naccum_count = 0\n")
    .replace(STEP_IF, "        accum_count += 1\n        if accum_count == ACCUM:\n")
    .replace("            steps += 1\n", "            steps += 1\n            accum_count = 0\n"),
    "or_last_batch": ACCUMULATING.replace(
        STEP_IF, "        if (i // 32 + 1) % ACCUM == 0 or (i // 32 + 1) == len(x) // 32:\n"
    ),
}


@pytest.mark.parametrize("idiom", sorted(ACCUMULATION_IDIOMS))
def test_replay_recognises_each_accumulation_idiom(idiom: str):
    """Accumulation was recognised from a `%` in the step's condition only: a counter (`accum_count += 1`, `if
    accum_count == ACCUM:`, reset after the step) kept its `/ ACCUM` in the replay's loss, every replay step at
    1/ACCUM of the trainer's."""
    source = ACCUMULATION_IDIOMS[idiom]
    assert source != ACCUMULATING
    result = apply_transform("hard_example_replay", source)
    loss = eval(
        ast.unparse(next(k.value for k in dream_call(result).keywords if k.arg == "loss")), {"F": F, "ACCUM": 2}
    )
    logits, targets = torch.randn(32, 10), torch.randint(0, 10, (32,))
    assert torch.allclose(loss(logits, targets), F.cross_entropy(logits, targets))
    ran = run(result)
    assert ran["steps"] == 3 * BATCHES // 2 and len(ran["dream_replay"].y) == BATCHES
    # the count recognised, a divisor that mixes it with another factor is refused as before
    mixed = source.replace("y[i : i + 32]) / ACCUM", 'y[i : i + 32], reduction="sum") / (32 * ACCUM)')
    with pytest.raises(NotApplicable, match=r"divided by `\(32 \* ACCUM\)`, which mixes the micro-batch count"):
        apply_transform("hard_example_replay", mixed)


def test_an_unrecognised_accumulation_keeps_the_replays_loss_as_written():
    """A step condition that counts no micro-batches the transform can read (a flag the trainer flips) leaves the
    loss as the trainer wrote it: its divisor may be a mean's, not an accumulation's."""
    source = ACCUMULATING.replace("steps = 0\n", "steps = 0\nflip = False\n").replace(
        STEP_IF, "        flip = not flip\n        if not flip:\n"
    )
    result = apply_transform("hard_example_replay", source)
    loss = next(k.value for k in dream_call(result).keywords if k.arg == "loss")
    assert ast.unparse(loss).endswith("/ ACCUM")
    assert run(result)["steps"] == 3 * BATCHES // 2
