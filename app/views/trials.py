"""Trials: every trial of the campaign with its knobs as columns; pick one for its reason, stderr tail and code."""

from __future__ import annotations

from pathlib import Path

import figures
import kbdata
import knobstats
import shell
import streamlit as st

from ralph_ray import front, sql

STATUSES = figures.TRIAL_STATUSES
TAIL_BYTES = 4096
COLUMNS = {
    "trial_id": st.column_config.TextColumn("trial"),
    "variant_id": st.column_config.TextColumn("variant"),
    "cycle": st.column_config.NumberColumn("cycle", width="small"),
    "status": st.column_config.TextColumn("status"),
    "reason": st.column_config.TextColumn("reason", help="why it stopped or failed, as the engine recorded it"),
    "kind": st.column_config.TextColumn(
        "kind",
        help="search: a knob sample; replicate: the best knobs again with a fresh seed; final: the pick's final "
        "training (safeguards.final_share), longer than any search trial; final + cosine + shift: with "
        "safeguards.final_additions added to its code (a schedule, shifts, flips, deepen: a hidden layer, flip_tta: "
        "flips at test time)",
    ),
    "epochs": st.column_config.NumberColumn("epochs", width="small"),
    "selection_score": st.column_config.NumberColumn("selection", format="%.4f"),
    "test_score": st.column_config.NumberColumn("test", format="%.4f"),
    "val_metric": st.column_config.NumberColumn(
        "last val", format="%.4f", help="the trainer's last reported validation metric"
    ),
    "cost_s": st.column_config.NumberColumn("cost s", format="%.1f", help=front.COST_HELP),
    "seconds": st.column_config.NumberColumn("wall s", format="%.1f", help="from the trial's start to its end"),
    "peak_rss_mb": st.column_config.NumberColumn(
        "peak RSS MiB", format="%.0f", help="the trainer's peak CPU memory (blank in older KBs)"
    ),
    "peak_gpu_mb": st.column_config.NumberColumn(
        "peak GPU MiB", format="%.0f", help="torch.cuda.max_memory_allocated at its end (blank without CUDA)"
    ),
    "seed": st.column_config.NumberColumn("seed", width="small"),
    "node": st.column_config.TextColumn("node", help="the IP of the Ray node the trial ran on (blank in older KBs)"),
    "work_dir": st.column_config.TextColumn(
        "work dir", help="on the driver's node; a trial on another node worked under that node's RALPH_WORK_DIR"
    ),
}


def body(run: shell.Campaign) -> None:
    trials = kbdata.frame(run.kb_root, sql.APP_TRIALS, (run.run_id,))
    if trials.empty:
        shell.no_trials_yet(run, "trial")
        return
    trials["cost_s"] = [front.cost_seconds(t, w) for t, w in zip(trials["train_seconds"], trials["seconds"])]
    table, knobs = knobstats.with_knobs(trials, "knobs")
    left, right = st.columns([2, 3])
    chosen = left.multiselect("status", STATUSES, default=STATUSES, key="trials_status")
    variants = sorted(table["variant_id"].dropna().unique())
    picked = right.multiselect(
        "variants", variants, default=[], key="trials_variants", format_func=figures.short, placeholder="all variants"
    )
    shown = table[table["status"].isin(chosen) | ~table["status"].isin(STATUSES)]
    if picked:
        shown = shown[shown["variant_id"].isin(picked)]
    order = list(COLUMNS)[:4] + knobs + list(COLUMNS)[4:]  # the knobs right after the status: visible without scrolling
    config = COLUMNS | {
        k: st.column_config.NumberColumn(k, format="%.4g")
        if knobstats.is_numeric(table[k])
        else st.column_config.TextColumn(k)
        for k in knobs
    }
    event = st.dataframe(
        figures.as_values(shown, run.sign),
        width="stretch",
        hide_index=True,
        column_order=order,
        column_config=config,
        placeholder="-",
        on_select="rerun",
        selection_mode="single-row",
        key="trials_table",
    )
    st.caption(
        f"{len(shown)} of {len(table)} trials; {len(knobs)} knob(s) as columns. Click a row (or pick below) for its "
        "stderr and its train.py as run; the table's toolbar searches and downloads it as CSV."
    )
    st.download_button(
        "Download as CSV",
        shown[[c for c in order if c in shown]].to_csv(index=False),
        file_name=f"{run.run_id}-trials.csv",
        mime="text/csv",
        key="trials_csv",
        icon=":material/download:",
    )

    ids = list(shown["trial_id"])
    if not ids:
        return
    rows = event.selection.rows if event is not None else []
    clicked = ids[rows[0]] if rows and rows[0] < len(ids) else None
    if clicked != st.session_state.get("trials_clicked"):  # a new click in the table picks the trial below
        st.session_state.trials_clicked = clicked
        if clicked is not None:
            st.session_state.trials_pick = clicked
    failed = [t for t in ids if t in set(shown.loc[shown["status"] == "failed", "trial_id"])]
    if st.session_state.get("trials_pick") not in ids:
        st.session_state.trials_pick = (failed or ids)[0]  # a failure first: that is what one comes here for
    trial = st.selectbox("trial", ids, key="trials_pick")
    details(figures.records(shown[shown["trial_id"] == trial])[0], knobs)
    segments(run, trial)


def details(rec: dict, knobs: list[str]) -> None:
    """One trial: how it ended and why, its knobs, its stderr tail and its train.py as run (from its work dir)."""
    st.subheader(f"Trial `{rec['trial_id']}`")
    st.markdown(
        f"**{rec.get('status') or '-'}** after {rec.get('epochs') or 0} epoch(s), {rec.get('cost_s') or 0:.1f} s of "
        f"cost ({rec.get('seconds') or 0:.1f} s wall) · "
        f"variant `{rec.get('variant_id')}` ({rec.get('variant_status') or '-'}) · reason: "
        f"{rec.get('reason') or 'none recorded'} · node {rec.get('node') or 'not recorded'}"
    )
    if knobs:
        st.caption("knobs: " + ", ".join(f"`{k} = {rec.get(k)}`" for k in knobs if rec.get(k) is not None))
    work = rec.get("work_dir")
    if not work:
        st.info("No work dir recorded for this trial.")
        return
    st.caption(f"work dir: `{work}`")
    folder = Path(work)
    if not folder.is_dir():
        st.info(
            f"The work dir `{work}` is not on this machine (it stays on the node that ran the trial, "
            "or was cleaned up)."
        )
        return
    stderr, code = _tail(folder / "stderr.log"), _read(folder / "train.py")
    st.markdown("**stderr (tail)**")
    st.code(stderr if stderr is not None else "(no stderr.log)", language="text")
    with st.expander("train.py as run (knobs written in)", expanded=False):
        st.code(code if code is not None else "(no train.py in the work dir)", language="python")


SEGMENT_COLUMNS = {
    "segment": st.column_config.NumberColumn("segment", width="small"),
    "from_epoch": st.column_config.NumberColumn("from epoch", width="small"),
    "to_epoch": st.column_config.NumberColumn("to epoch", width="small"),
    "variant_id": st.column_config.TextColumn("variant"),
    "knobs": st.column_config.TextColumn("knobs"),
    "donor_trial_id": st.column_config.TextColumn("weights from", help="the donor of an exploit step (PBT)"),
    "donor_epoch": st.column_config.NumberColumn("donor epoch", width="small"),
}


def segments(run: shell.Campaign, trial: str) -> None:
    """scheduler=pbt: the epochs the trial trained with each variant and knobs, and whose weights it took."""
    rows = kbdata.frame(run.kb_root, sql.APP_SEGMENTS, (run.run_id, trial))
    if rows.empty:
        return
    st.markdown("**Segments (population based training)**")
    st.dataframe(
        rows, width="stretch", hide_index=True, column_config=SEGMENT_COLUMNS, placeholder="-", key="trials_segments"
    )
    exploits = int(rows["donor_trial_id"].notna().sum())
    st.caption(f"{len(rows)} segment(s), {exploits} exploit step(s): a segment with a donor began from its weights.")


def _tail(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - TAIL_BYTES))
            return f.read().decode(errors="replace") or "(empty)"
    except OSError:
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


shell.page("Trials", body)
