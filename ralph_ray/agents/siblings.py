"""A parent's children so far in this run, as the analysts read them: what the gate refused for it (not proposed
again: a catalog edit comes out the same every time) and what was already bred from it (a last resort)."""

from __future__ import annotations

from ralph_ray.agents.base import ChildSeen, ParentView
from ralph_ray.variants import RejectedBy, VariantStatus

# How the heuristic coder quotes the gate when it gives up on a refused child (HeuristicCoder._edit): a refusal's
# reason is the gate's words after it.
GATE_SAID = "gate said: "
# A refusal's reason in the analysis is cut to this many characters (a smoke run's traceback can be long).
REFUSAL_CHARS = 300
# Children that count as bred: trained or training. A crashed one (every trial failed, the infrastructure's fault as
# often as the code's) may be bred again; a rejected one is a refusal (`refusals`).
BRED = (VariantStatus.candidate, VariantStatus.kept, VariantStatus.discarded)


def refusals(parent: ParentView) -> dict[str, str]:
    """Each intervention a rejected child of this parent carried, with why: the gate refused it for this very code,
    and a catalog edit comes out the same every time. A coder that failed before a draft, or a spent token budget,
    says nothing of the code (the next cycle may well write it)."""
    refused: dict[str, str] = {}
    for child in parent.children:
        if VariantStatus(child.status) is not VariantStatus.rejected or not _refused_for_the_code(child):
            continue
        reason = " ".join((child.reason or "no reason recorded").split())  # one line: the not_applicable view reads it
        _, said, gate = reason.partition(GATE_SAID)
        why = gate if said else reason
        if len(why) > REFUSAL_CHARS:
            why = why[: REFUSAL_CHARS - 3] + "..."
        for name in child.interventions:
            refused.setdefault(name, f"refused for this parent (child {child.variant_id}): {why}")
    return refused


def _refused_for_the_code(child: ChildSeen) -> bool:
    """Whether the child was rejected for its code: the gate refused it, or the offline coder found its edit does not
    apply (variants.rejected_by); a KB from before that column says it only in the reason's words, read as written."""
    if child.rejected_by is not None:
        return RejectedBy(child.rejected_by) in (RejectedBy.gate, RejectedBy.code)
    reason = child.reason or ""
    # the offline coder's "cannot apply" is about the code too (it would say the same again)
    coder_alone = reason.startswith("coder") and GATE_SAID not in reason and "cannot apply" not in reason
    return not (reason.startswith("token budget") or coder_alone)


def bred_from(parent: ParentView) -> dict[str, str]:
    """Each intervention already bred from this parent in this run, with the first child that carries it."""
    bred: dict[str, str] = {}
    for child in parent.children:
        if VariantStatus(child.status) in BRED:
            for name in child.interventions:
                bred.setdefault(name, child.variant_id)
    return bred
