"""The validation gate on real children of the digits seed: each broken kind is refused with its reason."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from ralph_ray import PROJECT_ROOT, warmstart
from ralph_ray.agents.transforms import apply_transform
from ralph_ray.gate import SMOKE_WORK, Gate, GateError, check_reach, write_smoke_data
from ralph_ray.tasks.digits import prepare

SEED = PROJECT_ROOT / "trainers" / "digits"


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    smoke = write_smoke_data(prepare(0, 0.2, 0.2), tmp_path_factory.mktemp("smoke"), "digits")
    return Gate(smoke, ("LR", "BATCH_SIZE", "WIDTH"), timeout_s=60)


def child_of_seed(tmp_path: Path, edit=None) -> tuple[Path, Path]:
    parent = tmp_path / "parent"
    shutil.copytree(SEED, parent, ignore=shutil.ignore_patterns("__pycache__"))
    child = tmp_path / "child"
    shutil.copytree(parent, child)
    if edit:
        source = (child / "train.py").read_text()
        (child / "train.py").write_text(edit(source))
    return child, parent


def test_a_good_child_passes(gate: Gate, tmp_path: Path):
    child, parent = child_of_seed(tmp_path, lambda s: s.replace("DROPOUT = 0.0", "DROPOUT = 0.2"))
    gate.check(child, parent)


def test_a_smoke_run_writes_in_the_knobs_it_is_given(gate: Gate, tmp_path: Path):
    # The final training smokes its pick's code with the pick's knobs, not the file's defaults.
    child, _ = child_of_seed(
        tmp_path,
        lambda s: s.replace("def main() -> None:\n", "def main() -> None:\n    assert WIDTH < 100, 'too wide'\n", 1),
    )
    gate.smoke(child)
    gate.smoke(child, {"WIDTH": 8, "NOT_A_KNOB": 1})  # a knob the code lacks is not written
    with pytest.raises(GateError, match="too wide"):
        gate.smoke(child, {"WIDTH": 512})


def test_a_smoke_run_holds_a_batch_knob_to_what_its_few_rows_can_fill(gate: Gate, tmp_path: Path):
    """User trial: `larger_batch` (BATCH_SIZE 256, a loader with `drop_last=True`) got no batch of the sliver's 144
    train rows, and OneCycleLR's "Expected positive integer steps_per_epoch, but got 0" rejected it twice."""
    line = "        order = torch.randperm(len(x_train))"
    no_batch = "        assert len(x_train) // BATCH_SIZE > 0, 'no full batch'\n" + line
    child, _ = child_of_seed(
        tmp_path, lambda s: s.replace("BATCH_SIZE = 64", "BATCH_SIZE = 256").replace(line, no_batch, 1)
    )
    source = (child / "train.py").read_text()
    assert "BATCH_SIZE = 256" in source and "no full batch" in source
    gate.smoke(child)
    gate.smoke(child, {"BATCH_SIZE": 512})  # a trial's own knobs too


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.replace("def main() -> None:", "def main() -> None"), "does not parse"),
        (lambda s: s.replace("        harness.report(", "        dict("), "no longer calls harness.report"),
        (
            lambda s: s.replace("harness.save_predictions(selection=", "print(").replace(
                "test=predict(model, test))", "predict(model, test))"
            ),
            "no longer calls harness.save_predictions",
        ),
        (
            lambda s: s.replace("WIDTH = 16  # channels of the first conv layer\n", "").replace("WIDTH,", "16,"),
            "WIDTH are searched",
        ),
        (
            lambda s: s.replace(
                "    model = Net(", "    raise RuntimeError('exploded at build time')\n    model = Net("
            ),
            "smoke run failed.*exploded",
        ),
        (
            lambda s: s.replace("selection=predict(model, selection)", "selection=predict(model, selection)[:3]"),
            "predicted",
        ),
    ],
)
def test_broken_children_are_refused_with_the_reason(gate: Gate, tmp_path: Path, edit, message):
    child, parent = child_of_seed(tmp_path, edit)
    with pytest.raises(GateError, match=message):
        gate.check(child, parent)


def test_an_edited_or_removed_frozen_file_is_refused(gate: Gate, tmp_path: Path):
    child, parent = child_of_seed(tmp_path)
    (child / "program.md").write_text("you may now read the labels\n")
    with pytest.raises(GateError, match="edited frozen file program.md"):
        gate.check(child, parent)
    (child / "program.md").unlink()
    with pytest.raises(GateError, match="removed frozen file program.md"):
        gate.check(child, parent)


def test_a_symlink_out_of_the_variant_is_refused(gate: Gate, tmp_path: Path):
    child, parent = child_of_seed(tmp_path)
    (child / "labels.py").symlink_to("/etc/hostname")
    with pytest.raises(GateError, match="symlink"):
        gate.check(child, parent)


@pytest.mark.parametrize(
    "line, message",
    [
        ("from ralph_ray.tasks.digits import prepare\n", "imports ralph_ray.tasks.digits"),
        ("import ralph_ray.kb\n", "imports ralph_ray.kb"),
        ("from ralph_ray import harness, scoring\n", "imports ralph_ray.scoring"),
        ("LABELS = __import__('importlib').import_module('ralph_ray.tasks')\n", "imports ralph_ray.tasks"),
        ("KB = open('/work/main/kb/kb.duckdb', 'rb')\n", "names the path '/work/main/kb/kb.duckdb'"),
        ("RUNS = '../../../runs'\n", "names the path '../../../runs'"),
    ],
)
def test_reaching_past_the_work_dir_is_refused_before_the_smoke_run(
    gate: Gate, tmp_path: Path, line: str, message: str
):
    # The AST check is the fast first line beside the sandbox: the child never starts.
    child, parent = child_of_seed(
        tmp_path, lambda s: s.replace("def main() -> None:", line + "\n\ndef main() -> None:")
    )
    with pytest.raises(GateError, match=f"train.py line \\d+: {message}"):
        gate.check(child, parent)


def test_a_path_or_import_the_parent_had_already_is_not_held_against_the_child():
    """User trial: a seed naming `/usr/share/datasets/...` trained, then every child was refused for that line of
    its parent's, and the KB blamed four interventions. The gate judges what the child adds."""
    source = (SEED / "train.py").read_text()
    parent = {"train.py": source.replace("def main() -> None:", "CKPT = '/tmp/ckpt.pt'\n\n\ndef main() -> None:")}
    child = {"train.py": parent["train.py"].replace("DROPOUT = 0.0", "DROPOUT = 0.2")}
    assert child != parent and "/tmp/ckpt.pt" in child["train.py"]
    check_reach(child, parent)  # the parent's own line: no refusal
    with pytest.raises(GateError, match="train.py line \\d+: names the path '/tmp/ckpt.pt'"):
        check_reach(child)  # judged without its parent, as before
    added = {"train.py": child["train.py"].replace("CKPT = ", "KB = '/work/kb'\nCKPT = ")}
    with pytest.raises(GateError, match="names the path '/work/kb'"):
        check_reach(added, parent)  # what the child adds is still refused
    with pytest.raises(GateError, match="imports ralph_ray.kb"):
        check_reach({**child, "extra.py": "import ralph_ray.kb\n"}, parent)  # and a file of its own, whole


def test_a_string_naming_the_package_is_no_import():
    """User trial: path parts `["", "work", "main", "ralph_ray"]` were refused as "imports ralph_ray"; imports are
    read from the syntax tree (statements, and a module named to an import call), not from any string."""
    source = (SEED / "train.py").read_text()
    parts = source.replace("def main() -> None:", 'PARTS = ["", "work", "main", "ralph_ray"]\n\n\ndef main() -> None:')
    check_reach({"train.py": parts}, {"train.py": source})
    named = parts.replace("PARTS = ", "MOD = importlib.import_module('ralph_ray.kb')\nPARTS = ")
    with pytest.raises(GateError, match="imports ralph_ray.kb"):
        check_reach({"train.py": named}, {"train.py": source})


def test_a_child_that_left_the_data_parallel_group_is_refused_when_trials_have_workers(gate: Gate, tmp_path: Path):
    """Under resources.workers_per_trial=N > 1 a child without harness.init_distributed would run as N copies."""
    child, parent = child_of_seed(tmp_path, lambda s: s.replace("    harness.init_distributed()", "    pass"))
    with pytest.raises(GateError, match="never calls harness.init_distributed.*data_parallel"):
        replace(gate, workers=2).check(child, parent)
    gate.check(child, parent)  # a single-worker campaign does not ask for it


def test_a_child_with_a_weight_average_is_refused_when_trials_have_workers(gate: Gate, tmp_path: Path):
    """The offline agent's EMA keeps a copy of the model outside DDP: not for a data-parallel trial's ranks."""
    child, parent = child_of_seed(tmp_path, lambda s: apply_transform("ema_weights", s))
    with pytest.raises(GateError, match="uses AveragedModel.*workers_per_trial=1"):
        replace(gate, workers=2).check(child, parent)


def test_a_warm_gate_forks_its_smoke_runs_from_a_server_with_torch_imported(gate: Gate, tmp_path: Path):
    """trial.warm: smoke runs as warm as trials (the breeder's cold `import torch` took ~50 s beside busy trials);
    the same child that needs a warm interpreter is refused cold, and no smoke work dir is left behind."""
    warm = replace(gate, warm=True)
    needs_warm = "import sys\nassert 'torch' in sys.modules, 'started cold'  # imported by the server, not by me\n"
    child, parent = child_of_seed(tmp_path, lambda s: needs_warm + s)
    try:
        warm.check(child, parent)
        with pytest.raises(GateError, match="smoke run failed.*started cold"):
            gate.check(child, parent)
    finally:
        warmstart.close_all()
    assert list((gate.smoke_data.parent / SMOKE_WORK).iterdir()) == []


def test_a_draft_reaching_for_the_labels_is_told_from_a_plain_bug(gate: Gate, tmp_path: Path):
    """User trial: a child caught reading held-out labels left no mark a user could find. The gate's refusals say
    what was caught: `reached_outside` tells an engine import, a path outside the work dir or a sandbox breach in the
    smoke run (the engine imported by a name the source check cannot read) from a plain bug."""
    from ralph_ray.gate import reached_outside

    sneaky = "LABELS = __import__('importlib').import_module('.'.join(['ralph_ray', 'tasks', 'digits']))\n"
    child, parent = child_of_seed(
        tmp_path, lambda s: s.replace("def main() -> None:", sneaky + "\n\ndef main() -> None:")
    )
    with pytest.raises(GateError) as caught:
        gate.check(child, parent)  # the source check cannot read the name: the sandboxed smoke run catches it
    assert str(caught.value).startswith("smoke run failed: forbidden path: ") and reached_outside(str(caught.value))
    assert reached_outside(f"attempt 2: {caught.value}")
    for line in ("from ralph_ray.tasks.digits import prepare\n", "KB = open('/work/main/kb/kb.duckdb', 'rb')\n"):
        with pytest.raises(GateError) as caught:
            check_reach({"train.py": line})
        assert reached_outside(f"attempt 1: {caught.value}")
    broken, _ = child_of_seed(
        tmp_path / "b", lambda s: s.replace("    model = Net(", "    raise RuntimeError('x')\n    model = Net(")
    )
    with pytest.raises(GateError) as caught:
        gate.smoke(broken)
    assert not reached_outside(str(caught.value)) and not reached_outside("train.py does not parse: x at line 1")
