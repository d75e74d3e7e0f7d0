"""Peak memory per trial: the runner's samples and the harness's own figure, cold, warm and sandboxed, into the KB."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from taskdirs import digits_task
from test_sandbox import POLICY, needs_bwrap

from ralph_ray import warmstart
from ralph_ray.kb import SCHEMAS, KnowledgeBase, open_reader
from ralph_ray.peakmemory import GpuUse
from ralph_ray.runner import Limits, Status, Trainer, run
from ralph_ray.sandbox import Policy, SandboxMode
from ralph_ray.tasks.base import write_public
from ralph_ray.tasks.digits import prepare
from ralph_ray.workdir import write_variant

PLAIN = Policy(SandboxMode.none)
# ~240 MiB of pages written (np.ones touches every page), held until exit.
ALLOCATES = """\
import numpy as np
from ralph_ray import harness
EPOCHS = 1  # epochs
data = harness.load_data()
block = np.ones(30_000_000)
harness.report(epoch=EPOCHS, val_acc=float(block[-1]) / 10)  # EPOCHS read: it is searched
harness.save_predictions(selection=np.zeros(len(data.selection_x), int), test=np.zeros(len(data.test_x), int))
"""
# Reports first, then allocates and waits to be stopped: only the runner's samples can see the allocation.
ALLOCATES_LATE = """\
import time
import numpy as np
from ralph_ray import harness
harness.report(epoch=1, val_acc=0.1)
block = np.ones(30_000_000)
open("allocated", "w").close()
time.sleep(60)
"""


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("public")
    write_public(prepare(0, 0.2, 0.2), folder, "digits")
    return folder


@pytest.fixture(autouse=True, scope="module")
def servers():
    yield
    warmstart.close_all()


def start(root: Path, public: Path, source: str, policy: Policy, warm: bool = False, stop=lambda: False):
    work = root / "trials" / ("warm" if warm else "cold")
    write_variant({"train.py": source.encode()}, work)
    return run(Trainer(work, public), Limits(60, sandbox=policy, warm=warm), should_stop=stop), work


def test_a_finished_trainer_reports_its_peak_rss(tmp_path: Path, public: Path):
    outcome, work = start(tmp_path, public, ALLOCATES, PLAIN)
    assert outcome.status is Status.finished, outcome.reason
    assert outcome.peak_rss_mb is not None and 240 <= outcome.peak_rss_mb < 2000
    assert outcome.peak_gpu_mb is None  # no CUDA used: no GPU figure, not a zero
    assert (work / "usage.json").exists()  # the harness's own figure, written at its exit


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_stopped_trainer_has_the_peak_the_runner_sampled(tmp_path: Path, public: Path, warm: bool):
    work = tmp_path / "trials" / ("warm" if warm else "cold")
    outcome, _ = start(tmp_path, public, ALLOCATES_LATE, PLAIN, warm, stop=lambda: (work / "allocated").exists())
    assert outcome.status is Status.stopped
    assert outcome.peak_rss_mb is not None and outcome.peak_rss_mb >= 240  # the harness last wrote before it


@needs_bwrap
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_sandboxed_trainer_reports_its_peak_rss(tmp_path: Path, public: Path, warm: bool):
    work = tmp_path / "trials" / ("warm" if warm else "cold")
    outcome, _ = start(tmp_path, public, ALLOCATES_LATE, POLICY, warm, stop=lambda: (work / "allocated").exists())
    assert outcome.status is Status.stopped
    assert outcome.peak_rss_mb is not None and outcome.peak_rss_mb >= 240


@pytest.mark.slow
def test_peak_rss_reaches_the_kb(ray_session, tiny_config, tmp_path: Path):
    from ralph_ray.campaign import run as run_campaign

    task = digits_task(tmp_path / "allocates", ALLOCATES)
    cfg = tiny_config(
        f"task.trainer={task}",
        "run_id=peak",
        "safeguards.max_cycles=1",
        "search.num_samples=1",
        "~search.space",
        "+search.space={EPOCHS: {type: choice, values: [1]}}",
    )
    outcome = run_campaign(cfg)
    rows = (
        open_reader(outcome.kb_root)
        .execute("select status, peak_rss_mb, peak_gpu_mb from trials where run_id = ?", ["peak"])
        .fetchall()
    )
    assert rows and all(status == "completed" for status, _, _ in rows)
    assert all(rss is not None and rss >= 240 for _, rss, _ in rows)
    assert all(gpu is None for _, _, gpu in rows)  # a CPU trainer: NULL, not 0
    report = (outcome.run_dir / "report" / "final_report.md").read_text()
    assert "- peak memory per trial: trainer RSS up to " in report and "no GPU memory (no trial used CUDA)" in report


def test_a_kb_from_before_peak_memory_reads_it_as_null(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    trials = kb.parquet / "trials"
    old = pa.schema([f for f in SCHEMAS["trials"] if not f.name.startswith("peak_")])
    pq.write_table(old.empty_table(), trials / "_schema.parquet")  # an old KB: no part has the peak columns
    row = {"run_id": "old", "cycle": 1, "trial_id": "a", "variant_id": "v", "status": "completed", "knobs": "{}"}
    pq.write_table(pa.Table.from_pylist([row], schema=pa.schema([old.field(k) for k in row])), trials / "old.parquet")
    got = open_reader(kb.root).execute("select trial_id, peak_rss_mb, peak_gpu_mb from trials").fetchall()
    assert got == [("a", None, None)]


def test_a_trial_given_a_gpu_that_never_started_cuda_is_said_once():
    use = GpuUse(0.25)
    assert use.check("t0", finished=True, gpu_mb=812.5) is None  # it used CUDA
    assert use.check("t1", finished=False, gpu_mb=None) is None  # stopped before its end: no verdict
    warning = use.check("t2", finished=True, gpu_mb=None)
    assert warning is not None and "trial t2 was given 0.25 GPU but never started CUDA" in warning
    assert use.check("t3", finished=True, gpu_mb=None) is None  # once per campaign
    assert GpuUse(0.0).check("t4", finished=True, gpu_mb=None) is None  # a CPU campaign: nothing to say
