"""The background breeder: a thread that keeps the pool's queue of gated children topped up.

It runs beside the Tune run, off the critical path: whenever fewer than `ahead` gated children wait for a slot,
it picks a parent from the population as it stands (the best so far, exploration, one per lineage, as
`population.select_parents` does; among the picks the one with the fewest children yet), has it analysed,
written and gated (`grow`, which uses children.py and the agents), and queues the children, whose generation
is the parent's + 1. One parent is bred at a time (the agents' own concurrency applies inside), and the gate's
smoke runs use one thread, so the breeder takes little CPU from the trials. It also runs at a lower CPU priority
(`population.breeder_nice`, inherited by its agents' threads and the gate's smoke runs, whose scheduler autogroups
the runner gives the same niceness; Ray's workers run at the driver's, raycluster.RAY_ENV_DEFAULTS): on
Fashion-MNIST on 2 cores, with the breeder out-ranking the trials, a completed 30-s trial trained 1.4-2.0 epochs
against 2.0-3.75 in the barrier loop (bench/breeding.py).
"""

from __future__ import annotations

import os
import random
import sys
import threading
from dataclasses import dataclass
from typing import Callable

from ralph_ray.children import Child
from ralph_ray.popsearch import Pool
from ralph_ray.population import Candidate, select_parents

# Parent picks in a row that produced no child (every idea a duplicate of a known variant) before it rests: it breeds
# again when a variant it has not tried out becomes a would-be parent, and ends once no trial still out can make one.
EMPTY_PICKS_LIMIT = 4


@dataclass(frozen=True)
class BreedingPlan:
    """How much to breed and from whom."""

    ahead: int  # gated children to keep waiting for a slot
    children_budget: int  # children (rejected ones included) the campaign may breed in all
    max_generation: int  # no child beyond this generation (safeguards.max_cycles reads as generations)
    parents: int
    explore: float
    one_per_lineage: bool
    seed: int
    nice: int = 0  # added to the breeder thread's niceness (Linux: per thread, inherited by what it starts)


class BackgroundBreeder(threading.Thread):
    """Keeps `pool`'s queue topped up with children from `grow(parent, generation)` until told to stop."""

    def __init__(
        self,
        pool: Pool,
        plan: BreedingPlan,
        bred: int,
        grow: Callable[[Candidate, int], list[Child]],
        log: Callable[[str], None],
    ) -> None:
        super().__init__(name="ralph-breeder", daemon=True)
        self.pool, self.plan, self.grow, self.log = pool, plan, grow, log
        self.bred = bred  # children bred so far (a resumed campaign counts those in the KB)
        self.busy = False  # a parent is being analysed, written or gated right now
        self.done = False  # nothing more to breed (budget spent, or no new idea): set once, never cleared
        self.out_of_ideas = False  # done because parent picks gave only known variants (not the children budget)
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._rng = random.Random(plan.seed)
        self._empty = 0
        self._tried_out: set[str] = set()  # would-be parents whose picks gave no new child when it last rested
        self._picks: dict[str, int] = {}  # parent id -> times picked (starts from the children it already has)

    def stop(self) -> None:
        """Ask the thread to end after the parent in hand (its children are still queued and recorded)."""
        self._halt.set()
        with self.pool.changed:
            self.pool.changed.notify_all()

    def idle(self) -> bool:
        """True when no breeding is under way and none will start (done, stopped or failed)."""
        return not self.busy and (self.done or self._halt.is_set() or self.error is not None)

    def run(self) -> None:
        lower_priority(self.plan.nice, self.log)
        try:
            while not self._halt.is_set():
                parent = self._next_parent()
                if parent is None:
                    return
                children = self.grow(parent, self._generation(parent) + 1)
                with self.pool.changed:
                    self.bred += len(children)
                    self.busy = False
                    self._empty = 0 if children else self._empty + 1
                    if self._empty >= EMPTY_PICKS_LIMIT:
                        self._rest()
                    self.pool.changed.notify_all()
        except BaseException as err:  # noqa: BLE001 - the driver reads it and ends the campaign with the cause
            self.error = err
        finally:
            with self.pool.changed:
                self.busy = False
                self.pool.changed.notify_all()

    def _rest(self) -> None:
        """Out of ideas for the would-be parents as they stand. A variant whose trials are still out (a child not
        judged yet) may become one: wait for that, then breed from it; end once none is out. Holds the pool's lock
        (waiting releases it). With one parent, giving up at once left a 30-min Fashion campaign breeding nothing
        for 25 minutes: its first kept child scored after the seed's ideas ran out."""
        self._tried_out |= self._would_be()
        if self._open():
            self.log(f"  breeder: {self._empty} parent picks in a row gave no new child; waiting for the trials out")
        while not self._halt.is_set() and not self._would_be() - self._tried_out and self._open():
            self.pool.changed.wait(timeout=1.0)
        fresh = self._would_be() - self._tried_out
        if fresh:
            self._empty = 0
            self.log(f"  breeder: {', '.join(sorted(fresh))} became a would-be parent; breeding again")
        elif not self._halt.is_set():
            self.log("  breeder: no trial still out can add a parent; breeding ends")
            self.done = self.out_of_ideas = True

    def _would_be(self) -> set[str]:
        """The variants parent selection would pick from now, before its lineage and exploration rules."""
        ranked = self.pool.ranked(below_generation=self.plan.max_generation)
        return {c.variant_id for c in ranked[: self.plan.parents]}

    def _open(self) -> bool:
        """A member still has queued trials to start or finish (a child waiting to be judged)."""
        return any(not m.judged for m in self.pool.members.values())

    def _next_parent(self) -> Candidate | None:
        """Wait until a child is wanted and a parent is eligible; None once breeding is over."""
        with self.pool.changed:
            while not self._halt.is_set() and not self.done:
                if self.bred >= self.plan.children_budget:
                    self.done = True
                    break
                if self.pool.queued() < self.plan.ahead:
                    parent = self._choose()
                    if parent is not None:
                        self.busy = True
                        return parent
                self.pool.changed.wait(timeout=1.0)
            self.pool.changed.notify_all()
            return None

    def _choose(self) -> Candidate | None:
        plan = self.plan
        ranked = self.pool.ranked(below_generation=plan.max_generation)
        picks = select_parents(ranked, plan.parents, plan.explore, plan.one_per_lineage, self._rng)
        if not picks:
            return None
        # Spread children over the would-be parents as a barrier cycle would: the least bred from goes next.
        for p in picks:
            self._picks.setdefault(p.variant_id, self.pool.children_of.get(p.variant_id, 0))
        choice = min(picks, key=lambda p: self._picks[p.variant_id])
        self._picks[choice.variant_id] += 1
        return choice

    def _generation(self, parent: Candidate) -> int:
        return self.pool.members[parent.variant_id].generation


def lower_priority(nice: int, log: Callable[[str], None]) -> None:
    """Raise the calling thread's niceness by `nice` (Linux keeps it per thread; threads and processes it starts
    inherit it). Elsewhere, or where refused, the breeder keeps the trials' priority and says so once."""
    if nice <= 0:
        return
    if not sys.platform.startswith("linux"):
        log(f"  breeder: population.breeder_nice={nice} is per thread on Linux only; breeding at the trials' priority")
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as err:
        log(f"  breeder: could not lower its CPU priority ({err}); breeding at the trials' priority")
