"""The command line: a missing dataset exits 2 with the fix and records nothing; `prepare` writes public data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ralph_ray.harness import PUBLIC_FILES


def test_missing_cifar10_exits_2_and_records_nothing(tmp_path: Path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ralph_ray",
            "+experiment=cifar10",
            f"data.root={tmp_path / 'cifar'}",
            "data.download=false",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "cifar-10-batches-py" in result.stderr and "data_batch_1" in result.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "kb").exists()


def test_prepare_writes_public_data_and_export_line(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "ralph_ray.prepare"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = tmp_path / "data" / "prepared" / "digits"
    assert sorted(p.name for p in out.iterdir()) == sorted(PUBLIC_FILES)
    assert f"export RALPH_DATA_DIR={out}" in result.stdout


def test_config_dir_adds_the_users_own_experiments(tmp_path: Path, capsys):
    from ralph_ray.__main__ import main

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text(
        "# @package _global_\n# python -m ralph_ray --config-dir ./conf +experiment=mine\n"
        "safeguards:\n  max_cycles: 7\nsearch:\n  num_samples: 3  # digits' task.yaml says 8: the experiment wins\n"
    )
    conf = str(tmp_path / "conf")
    for flags in (["--config-dir", conf], ["-cd", conf], [f"--config-dir={conf}"]):
        assert main([*flags, "+experiment=mine", "--cfg"]) == 0
        shown = capsys.readouterr().out
        assert "max_cycles: 7" in shown and "num_samples: 3" in shown
    assert main(["-cd", conf, "+experiment=mine", "search.num_samples=5", "--cfg"]) == 0
    assert "num_samples: 5" in capsys.readouterr().out  # the command line wins over the experiment
    assert main(["--config-dir", str(tmp_path / "nope"), "+experiment=mine"]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["+experiment=mine", "--cfg"]) == 2  # without the folder Hydra does not know it
    # a resume with the same flags finds the experiment too (review: the folder was dropped from what finds the run)
    from omegaconf import OmegaConf

    from ralph_ray.config import load_config

    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(load_config([]))))
    resume = [f"paths.runs={tmp_path / 'runs'}", "resume=r", "-cd", conf, "+experiment=mine", "--cfg"]
    assert main(resume) == 0, capsys.readouterr().err
