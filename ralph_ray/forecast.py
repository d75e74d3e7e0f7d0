"""A learning-curve forecaster beside ASHA (scheduler.forecast=true): a trial whose forecast final score cannot
beat the best final score so far, at the stated confidence (safeguards.confidence), stops early.

The forecast is a power-law fit of the partial curve, y(t) = a - b * t^(-c) (scipy.optimize.curve_fit), on
the oriented metric (higher is better), evaluated at the last epoch (scheduler.max_t); its uncertainty is the
fit's covariance carried to that point (the delta method). A trial stops when the forecast's one-sided upper
Student-t bound is below the best final value a trial of this Tune run reached. Every stop keeps its forecast
(`reason`), which the trial's row records. Thin over Tune: a `tune.Stopper`, combined with the run's own.
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
from ray import tune
from ray.tune.stopper import CombinedStopper
from scipy import stats
from scipy.optimize import OptimizeWarning, curve_fit

from ralph_ray import sql
from ralph_ray.config import Config
from ralph_ray.ledger import STOPPED_WITH_CYCLE, TrialRecord
from ralph_ray.statuses import TrialStatus
from ralph_ray.trials import REPLICATE_KEY

MIN_POINTS = 4  # three parameters: a fourth point gives the fit a residual to judge its spread by


def power_law(t: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    """A rising, saturating learning curve: a - b * t^(-c)."""
    return a - b * np.power(t, -c)


@dataclass(frozen=True)
class Forecast:
    """What the fit of a partial curve says about its last epoch."""

    epochs: int  # points fitted
    at: int  # the epoch forecast
    mean: float  # oriented
    sd: float  # of the forecast, from the fit's covariance

    def upper(self, confidence: float) -> float:
        """The one-sided upper Student-t bound of the forecast at `confidence`."""
        return self.mean + float(stats.t.ppf(confidence, max(1, self.epochs - 3))) * self.sd


def fit(epochs: list[float], values: list[float], at: int) -> Forecast | None:
    """The power-law forecast of an (oriented) partial curve at epoch `at`; None when it cannot be fitted."""
    if len(values) < MIN_POINTS:
        return None
    t, y = np.asarray(epochs, dtype=float), np.asarray(values, dtype=float)
    if not np.all(np.isfinite(y)):
        return None
    rise = max(float(y[-1] - y[0]), 1e-3)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OptimizeWarning)
            params, cov = curve_fit(
                power_law,
                t,
                y,
                p0=[float(y[-1]), rise, 0.5],
                bounds=([-np.inf, 0.0, 0.01], [np.inf, np.inf, 3.0]),
                maxfev=5000,
            )
    except (RuntimeError, ValueError):
        return None
    if not np.all(np.isfinite(cov)):
        return None
    a, b, c = params
    point = float(at)
    # d/d(a, b, c) of a - b * T^-c at T = `at`
    grad = np.array([1.0, -(point**-c), b * math.log(point) * point**-c])
    variance = float(grad @ cov @ grad)
    return Forecast(len(values), at, float(power_law(np.array([point]), a, b, c)[0]), math.sqrt(max(variance, 0.0)))


class ForecastStopper(tune.Stopper):
    """Stops a trial whose forecast final metric cannot beat the best final metric so far (at `confidence`)."""

    def __init__(self, metric: str, mode: str, last_epoch: int, confidence: float) -> None:
        self.metric, self.sign, self.last_epoch, self.confidence = (
            metric,
            1.0 if mode == "max" else -1.0,
            last_epoch,
            confidence,
        )
        self.curves: dict[str, dict[int, float]] = {}
        self.best: float | None = None  # oriented
        self.stops: dict[str, str] = {}  # trial id -> the forecast it was stopped on
        self.lock = threading.Lock()

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if (result.get("config") or {}).get(REPLICATE_KEY):
            return False  # a replicate runs to the end (replicates.SpareReplicates)
        epoch, value = result.get("epoch"), result.get(self.metric)
        if not isinstance(epoch, (int, float)) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        with self.lock:
            if trial_id in self.stops:
                return True  # stopped once: its forecast stands
            curve = self.curves.setdefault(trial_id, {})
            curve[int(epoch)] = self.sign * float(value)
            if int(epoch) >= self.last_epoch:
                final = curve[int(epoch)]
                self.best = final if self.best is None else max(self.best, final)
                return False
            if self.best is None:
                return False
            points = sorted(curve.items())
            forecast = fit([e for e, _ in points], [v for _, v in points], self.last_epoch)
            if forecast is None or forecast.upper(self.confidence) >= self.best:
                return False
            self.stops[trial_id] = self.describe(forecast)
            return True

    def describe(self, forecast: Forecast) -> str:
        """The stop's reason: the forecast, its bound and the best it could not reach."""
        shown = lambda v: f"{self.sign * v:.4f}"  # noqa: E731 - back to the metric's own direction
        bound = "upper" if self.sign > 0 else "lower"
        return (
            f"forecast stop: power-law fit of {forecast.epochs} epochs forecasts {self.metric} "
            f"{shown(forecast.mean)} ± {forecast.sd:.4f} at epoch {forecast.at}; its {self.confidence:.0%} "
            f"{bound} bound {shown(forecast.upper(self.confidence))} cannot reach the best so far "
            f"{shown(self.best or 0)}"
        )

    def reason(self, trial_id: str) -> str | None:
        """The forecast a trial was stopped on, if this stopper stopped it."""
        with self.lock:
            return self.stops.get(trial_id)

    def replay(self, curves: list[tuple[str, list[tuple[float, float]]]]) -> None:
        """Earlier search trials' (epoch, value) reports, in the metric's own direction: those that reached the last
        epoch set the best final value, as they did when they ran (a resumed Tune run forecasts at once)."""
        with self.lock:
            for _, points in curves:
                finals = [self.sign * value for epoch, value in points if int(epoch) >= self.last_epoch]
                if finals and math.isfinite(finals[-1]):
                    self.best = finals[-1] if self.best is None else max(self.best, finals[-1])

    def stop_all(self) -> bool:
        return False

    def __getstate__(self) -> dict[str, Any]:
        return {}  # Tune pickles its run config; the live stopper stays in the driver


def make(cfg: Config) -> ForecastStopper | None:
    """The run's forecaster when scheduler.forecast is on (epochs are its clock: none under trial.budget_s)."""
    if not cfg.scheduler.forecast or cfg.trial.budget_s is not None:
        return None
    return ForecastStopper(cfg.search.metric, cfg.search.mode, cfg.scheduler.max_t, cfg.safeguards.confidence)


def for_cycle(cfg: Config, con: duckdb.DuckDBPyConnection | None, run_id: str, cycle: int) -> ForecastStopper | None:
    """A barrier cycle's forecaster; a resumed cycle's (`con`: the KB) starts from the best final value of the
    cycle's recorded trials, as its ASHA rungs start from their reports, so its first trials are forecast."""
    forecaster = make(cfg)
    if con is not None:
        rebuild(forecaster, con, run_id, cycle)
    return forecaster


def rebuild(
    forecaster: ForecastStopper | None, con: duckdb.DuckDBPyConnection, run_id: str, cycle: int | None = None
) -> None:
    """A resumed run's forecaster, from the KB's curves of the run's earlier search trials (of `cycle` only, where
    given: the barrier loop's forecaster is a cycle's): not a replicate (the stopper never reads one), not a final
    training, not a trial the run's stop cut short (it runs again)."""
    if forecaster is None:
        return
    curves: dict[str, list[tuple[float, float]]] = {}
    # the curves as ASHA's resumed rungs read them (the same trials left out, the same cycle filter)
    for trial_id, replicate, epoch, name, value in con.execute(
        sql.RUNG_HISTORY, [run_id, STOPPED_WITH_CYCLE, cycle, forecaster.metric, "epoch"]
    ).fetchall():
        if not replicate and name == forecaster.metric and value is not None:
            curves.setdefault(trial_id, []).append((float(epoch), float(value)))
    forecaster.replay(list(curves.items()))


def combined(stopper: tune.Stopper, forecaster: ForecastStopper | None) -> tune.Stopper:
    """The run's own stopper, with the forecaster beside it when there is one."""
    return stopper if forecaster is None else CombinedStopper(stopper, forecaster)


def note(record: TrialRecord, forecaster: ForecastStopper | None) -> None:
    """A trial the forecaster stopped carries its forecast as its reason (the KB row records it)."""
    reason = forecaster.reason(record.trial_id) if forecaster is not None else None
    if reason is not None and record.status is TrialStatus.stopped_early:
        record.reason = reason
