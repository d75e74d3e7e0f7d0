"""What an LLM analyst is shown of a parent: its curves carry the RL telemetry where the trainer reports it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ralph_ray.agents.base import ChildSeen, EpochPoint, ParentView, TrialSummary
from ralph_ray.agents.prompts import show_parent


def parent_with(tmp_path: Path, curve: list[EpochPoint]) -> ParentView:
    (tmp_path / "train.py").write_text("LR = 0.001\n")
    trial = TrialSummary("t0", "completed", None, {"LR": 0.001}, 0.4, curve)
    return ParentView("v0", tmp_path, 0.4, [trial], [], [], "program")


def test_an_rl_curve_shows_its_telemetry_and_a_vision_curve_does_not(tmp_path: Path):
    rl = [
        EpochPoint(epoch=e, val_acc=0.4, reward_mean=0.3, reward_std=0.07, kl=0.04, zero_spread_frac=0.84)
        for e in (1, 2)
    ]
    shown = show_parent(parent_with(tmp_path, rl), [], [])
    header = next(line for line in shown.splitlines() if line.startswith("| epoch"))
    assert header.endswith("| seconds | reward_mean | reward_std | kl | zero_spread_frac |")  # none of the absent ones
    assert "| 2 | - | - | 0.4 | - | - | - | 0.3 | 0.07 | 0.04 | 0.84 |" in shown
    vision = [EpochPoint(epoch=1, train_loss=0.5, val_acc=0.9)]
    header = next(line for line in show_parent(parent_with(tmp_path, vision), [], []).splitlines() if "| epoch" in line)
    assert header == "| epoch | train_loss | val_loss | val_acc | lr | grad_norm | seconds |"


def test_the_llm_analyst_sees_the_probes_and_the_metrics_the_trainer_named(tmp_path: Path):
    curve = [
        EpochPoint(epoch=1, val_acc=0.8, gen_gap=0.05, update_ratio=0.01, others={"val_f1": 0.71}),
        EpochPoint(epoch=2, val_acc=0.9, gen_gap=0.12, update_ratio=0.002, others={"val_f1": 0.83}),
    ]
    shown = show_parent(parent_with(tmp_path, curve), [], [])
    header = next(line for line in shown.splitlines() if line.startswith("| epoch"))
    assert header.endswith("| seconds | gen_gap | update_ratio | val_f1 |")  # no absent probe, no RL column
    assert "| 2 | - | - | 0.9 | - | - | - | 0.12 | 0.002 | 0.83 |" in shown


def test_the_llm_analyst_sees_what_the_gate_refused_for_the_parent_and_what_was_bred(tmp_path: Path):
    """Before, only the offline analyst skipped a refused intervention: an LLM was shown no children and could
    propose the same refused edit every cycle."""
    plain = parent_with(tmp_path, [EpochPoint(epoch=1, val_acc=0.9)])
    assert "children so far" not in show_parent(plain, [], [])  # a parent nothing was bred from yet
    children = [
        ChildSeen(
            "c1", ["augmentation"], "rejected", "coder: gave up; gate said: shift_images: (32, 30) is no image", "gate"
        ),
        ChildSeen("c2", ["batchnorm"], "kept"),
        ChildSeen("c3", ["dropout"], "rejected", "coder: the endpoint timed out after 3 retries", "coder"),
    ]
    shown = show_parent(dataclasses.replace(plain, children=children), [], [])
    section = shown[shown.index("## This parent's children so far") :]
    assert "- `c1`: augmentation, rejected" in section and "- `c2`: batchnorm, kept" in section
    refused = section[section.index("Refused by the validation gate") : section.index("Already bred")]
    assert "`augmentation`: refused for this parent (child c1): shift_images: (32, 30) is no image" in refused
    assert "dropout" not in refused  # the coder's own failure says nothing of the code
    assert "Already bred from this parent (propose again only if nothing else fits): batchnorm" in section
