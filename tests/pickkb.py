"""A KB (written with the real writer) whose best single trial and pick differ, and whose replicate intervals reach
past accuracy's 1: the seed's luckiest trial scored 0.99, but its child's fresh seeds average higher."""

from __future__ import annotations

import json
from pathlib import Path

from ralph_ray.kb import KnowledgeBase, now
from ralph_ray.state import CampaignState, Phase, RunStatus

RUN = "r1"
# (variant, trial id, selection score, replicate, seed): seed's replicate mean 0.94 (its best trial 0.99), kid's 0.97
TRIALS = (
    ("seed", "s0", 0.99, False, 0),
    ("seed", "s1", 0.93, True, 1),
    ("seed", "s2", 0.95, True, 2),
    ("kid", "k0", 0.97, False, 0),
    ("kid", "k1", 0.94, True, 1),
    ("kid", "k2", 1.00, True, 2),
)
# kid: mean 0.97, sd 0.0424, t(0.975, 1) = 12.7062: 0.97 +- 0.3812, [0.5888, 1.3512] clipped to [0.5888, 1.0]
KID_HALF, KID_LOW = 0.3812, 0.5888


def pick_kb(root: Path, run_dir: Path | None = None) -> tuple[Path, Path]:
    """The KB root and the run dir (state.json as a finished campaign leaves it: best single trial 0.99, the seed)."""
    run_dir = run_dir or root / "runs" / RUN
    run_dir.mkdir(parents=True, exist_ok=True)
    CampaignState(
        RUN,
        phase=Phase.done,
        status=RunStatus.finished,
        cycle=2,
        best_selection_score=0.99,
        best_variant_id="seed",
    ).save(run_dir)
    config = {"task": {"metric": "accuracy", "direction": "max"}, "safeguards": {"max_cycles": 2}}
    (run_dir / "config.yaml").write_text(json.dumps(config))  # JSON is YAML: as the campaign stores its config
    kb = KnowledgeBase(root / "kb")
    kb.init()
    kb.append(
        "runs",
        [
            {
                "run_id": RUN,
                "experiment": "digits",
                "task": "digits",
                "run_dir": str(run_dir),
                "status": "finished",
                "stop_reason": "max_cycles",
                "config": json.dumps(config),
                "started_at": now(),
            }
        ],
        RUN,
    )
    variants = [
        {"run_id": RUN, "variant_id": "seed", "cycle": 1, "status": "kept", "interventions": "[]"},
        {"run_id": RUN, "variant_id": "kid", "parent_id": "seed", "cycle": 2, "status": "kept"},
    ]
    for v in variants:  # each variant's trainer folder, as export copies it
        v["files_dir"] = str(root / "variants" / v["variant_id"])
        Path(v["files_dir"]).mkdir(parents=True, exist_ok=True)
        (Path(v["files_dir"]) / "train.py").write_text("LR = 0.1  # learning rate\n")
    kb.put("variants", [{**v, "interventions": v.get("interventions", '["batchnorm"]')} for v in variants], RUN)
    kb.append(
        "trials",
        [
            {
                "run_id": RUN,
                "cycle": 1 if variant == "seed" else 2,
                "trial_id": trial_id,
                "variant_id": variant,
                "status": "completed",
                "knobs": json.dumps({"LR": 0.1}),
                "seed": seed,
                "epochs": 2,
                "selection_score": score,
                "test_score": score,
                "seconds": 1.0,
                "replicate": replicate,
                "work_dir": "",
            }
            for variant, trial_id, score, replicate, seed in TRIALS
        ],
        RUN,
    )
    return kb.root, run_dir
