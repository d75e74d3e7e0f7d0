"""Text tasks: a prepare() that returns raw text (`df["text"].values`, an object array, or pandas 3's string array)
gets it saved as fixed-width numpy strings that trials memory-map; other Python objects stop `ralph_ray.prepare` and
the campaign with exit 2 and the fix, before Ray starts. A real tiny campaign runs on a CSV of sentences with the
tokenizer in train.py (user trial: `prepare` said OK, then every trial failed with "Array can't be memory-mapped:
Python objects in dtype", exit 4 after Ray started)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ralph_ray import harness, sandbox
from ralph_ray.__main__ import main
from ralph_ray.config import load_config
from ralph_ray.harness import ENV_DATA_DIR
from ralph_ray.kb import open_reader
from ralph_ray.prepare import main as prepare_main
from ralph_ray.tasks import DataError, prepare_splits
from ralph_ray.tasks.base import Splits, public_array, text_limit_bytes, text_memory_note, write_public

TOPICS = {
    "sports": ["goal", "match", "team", "coach", "league"],
    "finance": ["stock", "bank", "market", "bond", "profit"],
    "weather": ["rain", "storm", "sunny", "wind", "forecast"],
}
FILLER = ["the", "a", "today", "said", "new", "report", "city", "after"]

PREPARE = """
from pathlib import Path

import numpy as np
import pandas as pd

from ralph_ray.tasks.base import DataSource, Splits, TaskSettings, stratified_split

METRIC = {"name": "macro_f1", "direction": "max"}
LABELS = ["sports", "finance", "weather"]


def prepare(settings: TaskSettings, data: DataSource) -> Splits:
    df = pd.read_csv(Path(__file__).resolve().parent / "data" / "news.csv")
    x = INPUTS
    y = df["label"].map({n: i for i, n in enumerate(LABELS)}).to_numpy(dtype=np.int64)
    tr, se, te = stratified_split(y, (settings.selection_fraction, settings.test_fraction), settings.split_seed)
    return Splits(x[tr], y[tr], x[se], y[se], x[te], y[te], num_classes=len(LABELS))
"""

TRAIN = """
import re

import numpy as np
import torch
import torch.nn.functional as F

from ralph_ray import harness

LR = 0.05
EPOCHS = 2
MAX_LEN = 12


def tokenize(text):
    return re.findall(r"[a-z]+", text.lower())


def encode(texts, vocab):
    out = np.zeros((len(texts), MAX_LEN), dtype=np.int64)
    for i, text in enumerate(texts):
        ids = [vocab.get(token, 1) for token in tokenize(text)][:MAX_LEN]
        out[i, : len(ids)] = ids
    return torch.from_numpy(out)


def main():
    torch.manual_seed(harness.seed())
    data = harness.load_data()
    words = sorted({token for text in data.train_x for token in tokenize(text)})
    vocab = {word: i for i, word in enumerate(words, start=2)}  # 0 pads, 1 is unknown
    x, y = encode(data.train_x, vocab), torch.as_tensor(np.asarray(data.train_y))
    model = torch.nn.Sequential(
        torch.nn.EmbeddingBag(len(vocab) + 2, 16, mode="mean", padding_idx=0), torch.nn.Linear(16, data.num_classes)
    )
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for epoch in harness.epochs(EPOCHS):
        for _ in range(20):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        acc = (model(x).argmax(1) == y).float().mean().item()
        harness.report(epoch=epoch, train_loss=loss.item(), val_loss=loss.item(), val_acc=acc)
    with torch.no_grad():
        predict = lambda texts: model(encode(texts, vocab)).argmax(1).numpy()  # noqa: E731
        harness.save_predictions(selection=predict(data.selection_x), test=predict(data.test_x))


if __name__ == "__main__":
    main()
"""

TASK_YAML = """
task: {split_seed: 0, selection_fraction: 0.2, test_fraction: 0.2}
search:
  num_samples: 2
  max_concurrent: 2
  metric: val_acc
  mode: max
  space:
    LR: {type: loguniform, low: 0.01, high: 0.1}
scheduler: {max_t: 2, grace_period: 1}
"""


def _text_task(folder: Path, inputs: str = 'df["text"].values', missing: bool = False) -> Path:
    """A task folder over a CSV of 150 short sentences (3 topics) that the test writes into its data/ folder."""
    (folder / "data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    with (folder / "data" / "news.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for i in range(150):
            topic = list(TOPICS)[i % 3]
            words = [*rng.choice(TOPICS[topic], 2), *rng.choice(FILLER, int(rng.integers(2, 8)))]
            writer.writerow(["" if missing and i % 15 == 7 else " ".join(rng.permutation(words)), topic])
    (folder / "prepare.py").write_text(PREPARE.replace("INPUTS", inputs))
    (folder / "train.py").write_text(TRAIN)
    (folder / "task.yaml").write_text(TASK_YAML)
    (folder / "program.md").write_text("Classify news sentences by topic; the tokenizer is in train.py.\n")
    return folder


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


def test_raw_text_is_saved_as_fixed_width_strings_that_a_trainer_memory_maps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    folder = _text_task(tmp_path / "textclf")
    splits = prepare_splits(load_config([f"task={folder}"]))
    assert splits.train_x.dtype.kind == "U" and isinstance(splits.train_x, np.ndarray)  # was pandas' string array
    assert text_memory_note(splits) is None  # a few kB: nothing to say
    monkeypatch.chdir(tmp_path)
    assert prepare_main([f"task={folder}"]) == 0
    prepared = tmp_path / "data" / "prepared" / "textclf"
    saved = np.load(prepared / "train_x.npy", mmap_mode="c")
    assert saved.dtype.kind == "U" and list(saved) == list(splits.train_x)
    # the user's path: the export line, then `python train.py` by hand (it failed in harness.load_data)
    done = _cli("train.py", cwd=folder, env={ENV_DATA_DIR: str(prepared)})
    assert done.returncode == 0, done.stderr
    with np.load(folder / "predictions.npz") as predictions:
        assert predictions["selection"].shape == (30,)


@pytest.mark.parametrize(
    ("inputs", "missing", "found"),
    [
        ('df["text"].values', True, "is float (nan), not str"),  # a missing text: NaN among the strings
        ('np.array([{"text": t} for t in df["text"]], dtype=object)', False, "element 0 is dict"),
        ('np.array([len(t) if i % 2 else t for i, t in enumerate(df["text"])], dtype=object)', False, "is int"),
    ],
)
def test_other_python_objects_stop_prepare_with_exit_2_and_the_fix(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    inputs: str,
    missing: bool,
    found: str,
):
    folder = _text_task(tmp_path / "textclf", inputs, missing)
    monkeypatch.chdir(tmp_path)
    assert prepare_main([f"task={folder}"]) == 2
    stderr = capsys.readouterr().err
    assert "train_x is an array of Python objects, which trials cannot memory-map" in stderr
    assert found in stderr and "fix: return numbers (features, token ids) or text as strings" in stderr
    assert 'df["text"].fillna("").to_numpy(dtype=str)' in stderr
    assert not (tmp_path / "data").exists()  # nothing written


def test_a_campaign_on_python_objects_exits_2_before_ray_starts(tmp_path: Path):
    folder = _text_task(tmp_path / "textclf", missing=True)
    runs, kb = tmp_path / "runs", tmp_path / "kb"
    unsandboxed = ["sandbox=none"] if sandbox.available() is not None else []
    done = _cli("-m", "ralph_ray", f"task={folder}", f"paths.runs={runs}", f"paths.kb={kb}", *unsandboxed, cwd=tmp_path)
    # was exit 4, from every trial, after Ray started
    assert done.returncode == 2 and "is float (nan), not str" in done.stderr and "fix:" in done.stderr, done.stderr
    assert not kb.exists() and not runs.exists()  # no run recorded


def test_public_array_keeps_numbers_converts_text_and_refuses_the_rest(tmp_path: Path):
    numbers = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert public_array(numbers, "train_x") is numbers
    pairs = public_array(np.array([["a b", "c"], ["d", "efgh"]], dtype=object), "train_x")  # sentence pairs
    assert pairs.dtype == np.dtype("<U4") and pairs.shape == (2, 2)
    with pytest.raises(DataError, match=r"test_x is an array of Python objects.*element 1 is bytes"):
        public_array(np.array(["x", b"y"], dtype=object), "test_x")
    with pytest.raises(DataError, match="element 0 is NoneType"):
        public_array(np.array([None, "y"], dtype=object), "test_x")
    # Splits made by hand (the gate's sliver, export) go through write_public, which holds them to the same rule
    text = np.array(["one two", "three", "four five six", "seven"], dtype=object)
    splits = Splits(text, np.array([0, 1, 0, 1]), text[:2], np.array([0, 1]), text[2:], np.array([0, 1]), 2)
    write_public(splits, tmp_path / "public", "hand")
    assert np.load(tmp_path / "public" / "train_x.npy", mmap_mode="c").dtype == np.dtype("<U13")
    # the memory cost, named once it is big: every text as wide as the longest, 4 bytes a character
    big = Splits(public_array(text, "train_x"), splits.train_y, text[:2], splits.selection_y, text[2:], splits.test_y)
    note = text_memory_note(big, limit=100)
    assert note is not None and "train_x 4 x 13 characters x 4 bytes" in note and "Truncate long texts" in note
    assert text_memory_note(big, limit=1000) is None


def test_numpy_string_dtype_and_numbers_as_objects_are_saved_as_arrays_trials_memory_map(tmp_path: Path):
    """Reviewer: numpy 2's StringDType and `df.values` over int and bool columns (an object array of numbers) were
    refused as Python objects, though each converts as it is."""
    import pandas as pd

    strings = np.array(["one two", "three"], dtype=np.dtypes.StringDType())
    assert public_array(strings, "train_x").dtype == np.dtype("<U7")
    missing = np.array(["one", None], dtype=np.dtypes.StringDType(na_object=None))
    with pytest.raises(DataError, match="element 1 is NoneType"):  # a missing text, named as in an object array
        public_array(missing, "train_x")
    table = pd.DataFrame({"count": [3, 4], "flag": [True, False], "ratio": [0.5, 1.5]}).values
    assert table.dtype == object
    numbers = public_array(table, "train_x")
    assert numbers.dtype == np.float64 and numbers.tolist() == [[3.0, 1.0, 0.5], [4.0, 0.0, 1.5]]
    with pytest.raises(DataError, match="element 1 is dict"):
        public_array(np.array([1, {"a": 1}], dtype=object), "train_x")
    splits = Splits(table, np.array([0, 1]), table, np.array([0, 1]), strings, np.array([0, 1]), 2)
    write_public(splits, tmp_path / "public", "hand")
    assert np.load(tmp_path / "public" / "train_x.npy", mmap_mode="c").dtype == np.float64
    assert np.load(tmp_path / "public" / "test_x.npy", mmap_mode="c").dtype == np.dtype("<U7")


def test_text_too_large_as_fixed_width_strings_is_refused_before_it_is_allocated():
    """Reviewer: only MemoryError caught an oversized conversion, and under Linux's overcommit a large one is allocated
    page by page until the process is OOM-killed: its size is checked first, against half the physical memory."""
    limit = text_limit_bytes()
    assert limit is not None and limit > 0
    longest = 1_000_000
    count = limit // (4 * longest) + 1  # one long text among short ones: every text as wide as the longest
    texts = np.array(["x" * longest] + ["short"] * (count - 1), dtype=object)
    with pytest.raises(DataError, match=rf"train_x holds {count} texts of up to {longest} characters") as refused:
        public_array(texts, "train_x")
    assert "more than half this machine's physical memory" in str(refused.value)
    assert 'fix: truncate the texts in prepare() (df["text"].str.slice(0, 2000))' in str(refused.value)
    small = np.array(["ten chars!"] * 3, dtype=object)
    with pytest.raises(DataError, match="need 0.0 MB, more than the 0.0 MB allowed"):
        public_array(small, "train_x", limit=119)  # 3 x 10 characters x 4 bytes = 120
    assert public_array(small, "train_x", limit=120).dtype == np.dtype("<U10")


def test_a_truncated_public_file_is_not_called_an_object_array(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Reviewer: every ValueError from np.load was reported as an object array with "run prepare again"."""
    for name in ("train_x", "train_y", "selection_x", "test_x"):
        np.save(tmp_path / f"{name}.npy", np.arange(1000, dtype=np.float64))
    (tmp_path / "meta.json").write_text(json.dumps({"num_classes": 2}))
    with open(tmp_path / "train_x.npy", "r+b") as file:
        file.truncate(2000)  # a copy cut short
    monkeypatch.setenv(ENV_DATA_DIR, str(tmp_path))
    with pytest.raises(ValueError, match="mmap length is greater than file size"):
        harness.load_data()


def test_an_object_array_prepared_before_is_named_with_the_fix_not_numpys_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    text = np.array(["one two", "three"], dtype=object)
    for name, array in {"train_x": text, "train_y": np.array([0, 1]), "selection_x": text, "test_x": text}.items():
        np.save(tmp_path / f"{name}.npy", array, allow_pickle=True)
    (tmp_path / "meta.json").write_text(json.dumps({"num_classes": 2}))
    monkeypatch.setenv(ENV_DATA_DIR, str(tmp_path))
    with pytest.raises(SystemExit, match=r"train_x.npy cannot be memory-mapped .*run `python -m ralph_ray.prepare`"):
        harness.load_data()


@pytest.mark.slow
def test_a_campaign_on_raw_text_completes_its_trials(ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    folder = _text_task(tmp_path / "textclf")
    monkeypatch.chdir(tmp_path)
    overrides = [
        f"task={folder}",
        "run_id=text",
        "agent=none",
        "population.mode=generations",
        "safeguards.max_cycles=1",
        "safeguards.replicates=0",
        "population.parents=1",
        "population.children_per_parent=1",
        "safeguards.trial_timeout_s=300",
    ]
    if sandbox.available() is not None:
        overrides.append("sandbox=none")
    assert main(overrides) == 0
    con = open_reader(tmp_path / "kb")
    rows = con.execute("select status, selection_score from trials where run_id = 'text'").fetchall()
    assert len(rows) == 2 and {status for status, _ in rows} <= {"completed", "stopped_early"}, rows  # none failed
    assert max(score for status, score in rows if status == "completed") > 0.5, rows  # 3 topics: chance is 1/3
