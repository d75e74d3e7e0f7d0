"""Diff: a variant's code change against its parent and against the seed, with the analysis and rationale behind it."""

from __future__ import annotations

import difflib
from pathlib import Path

import figures
import kbdata
import shell
import streamlit as st

from ralph_ray import sql


@st.cache_data(ttl=60, show_spinner=False, max_entries=128)
def diff_against(old_dir: str, new_dir: str) -> str | None:
    """The unified diff of two variant folders (`files_dir` in the KB: content-hashed, so immutable, and holding
    the variant's files only); None when either folder is gone."""
    old, new = Path(old_dir), Path(new_dir)
    if not (old.is_dir() and new.is_dir()):
        return None
    before, after = _texts(old), _texts(new)
    chunks: list[str] = []
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            chunks.extend(difflib.unified_diff(before.get(name, []), after.get(name, []), f"a/{name}", f"b/{name}"))
    return "".join(line if line.endswith("\n") else line + "\n" for line in chunks)


def _texts(folder: Path) -> dict[str, list[str]]:
    """Every file of a variant folder as lines, by relative path."""
    return {
        str(p.relative_to(folder)): p.read_text(errors="replace").splitlines(keepends=True)
        for p in folder.rglob("*")
        if p.is_file()
    }


def parent_section(analysis: str, parent_id: str | None) -> str | None:
    """The analyst's notes on one parent (the `## parent <id>` section of analysis.md)."""
    if not parent_id:
        return None
    for section in analysis.split("\n## ")[1:]:
        if section.startswith(f"parent {parent_id}"):
            return "## " + section.strip()
    return None


def body(run: shell.Campaign) -> None:
    variants = figures.records(kbdata.frame(run.kb_root, sql.APP_LINEAGE, (run.run_id,)))
    if not variants:
        shell.no_trials_yet(run, "variant")
        return
    by_id = {v["variant_id"]: v for v in variants}
    seed = next((v for v in variants if not v.get("parent_id")), None)
    # Children first (best first): the seed has nothing to diff.
    order = sorted(by_id, key=lambda v: (by_id[v] is seed, -(by_id[v].get("selection_score") or float("-inf"))))
    picked = by_id[
        st.selectbox(
            "variant",
            order,
            key="diff_variant",
            format_func=lambda v: (
                f"{figures.short(v)} · {by_id[v]['status']} · "
                f"{figures.score_text(by_id[v].get('selection_score'), sign=run.sign)} · "
                f"{by_id[v].get('step') or '-'}"
            ),
        )
    ]
    parent = by_id.get(picked.get("parent_id") or "")
    st.markdown(
        f"**{picked['variant_id']}** ({picked['status']}, cycle {picked.get('cycle')}) · parent "
        f"`{picked.get('parent_id') or '-'}` · interventions: "
        f"{', '.join(figures.interventions(picked.get('interventions'))) or '-'}"
    )

    vs_parent, vs_seed = st.tabs(["against its parent", "against the seed"])
    with vs_parent:
        if not picked.get("parent_id"):
            st.info("This is the seed trainer: it has no parent. Pick a child.")
        elif picked.get("diff"):
            st.code(picked["diff"], language="diff")
        else:
            # No diff recorded (a knob-only child keeps none): compare the folders when they are still there.
            text = diff_against((parent or {}).get("files_dir") or "", picked.get("files_dir") or "")
            if text:
                st.caption("No diff recorded in the KB; computed from the variant folders.")
                st.code(text, language="diff")
            else:
                st.info("No change against its parent recorded (a rejected child, or the same code with other knobs).")
    with vs_seed:
        if seed is None or picked is seed:
            st.info("This is the seed trainer." if seed is not None else "The seed variant is not in the KB.")
        else:
            text = diff_against(seed.get("files_dir") or "", picked.get("files_dir") or "")
            if text is None:
                st.warning(
                    f"The variants' files are gone from `{picked.get('files_dir')}` (run dir moved or deleted): "
                    "only the diff against the parent, kept in the KB, is available."
                )
            else:
                st.code(text or "(identical code)", language="diff")

    st.subheader("Why")
    st.markdown(f"**Diagnosis:** {picked.get('diagnosis') or '-'} · **reason:** {picked.get('reason') or '-'}")
    st.markdown("**Agent's rationale**")
    st.markdown(picked.get("rationale") or "_none recorded_")
    cycle = picked.get("cycle")
    facts = kbdata.cycle(run.kb_root, run.run_id, int(cycle)) if cycle is not None else {}
    analysis, cycle_dir = facts.get("analysis"), facts.get("cycle_dir")
    st.markdown(f"**Analysis** (`{cycle_dir}/analysis.md`)" if cycle_dir else "**Analysis**")
    if analysis is None:
        st.caption(
            "No analysis recorded for this variant's cycle (cycle 1 is the seed's knob search; "
            "or the campaign was recorded before the KB kept analyses)."
        )
    else:
        section = parent_section(analysis, parent and parent["variant_id"])
        with st.container(border=True):
            st.markdown(section or analysis)
        if section:
            with st.expander("the whole cycle's analysis"):
                st.markdown(analysis)


shell.page("Diff", body)
