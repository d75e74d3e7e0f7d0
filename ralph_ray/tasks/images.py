"""Whether a task's train inputs are images, read from their shape and, for flat rows of side * side features, from
how much more neighbouring features correlate than other pairs (task.images, where task.yaml leaves it unset)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

# The fewest features a flat input may have to read as a flattened square image (4x4; digits' 64 are 8x8 images).
# Below it a "square" (iris's 4, wine's 9) has too few neighbour pairs for the correlation test to mean anything.
MIN_FLAT_IMAGE = 16
# The rows the neighbour test reads (evenly spaced): enough for stable correlations, cheap at 784 features.
SAMPLE_ROWS = 2000
# Fewer rows than this (after dropping rows with NaN/inf): correlations are noise, and the shape decides alone.
MIN_SAMPLE_ROWS = 10
# How much higher the mean correlation of horizontally and vertically adjacent features must be than that of all
# other pairs for flat rows to read as a flattened square image. Measured (this statistic, 2000 rows at most):
#   images:  digits 8x8 +0.42 (raw or standardised; +0.44 on 50 rows), Fashion-MNIST 28x28 +0.65 (3000 rows)
#   tables:  breast_cancer standardised, first 25 columns +0.08, first 16 +0.07, last 25 +0.09, last 16 +0.13;
#            normal noise 16 / 25 / 64 columns -0.01 / -0.02 / -0.00 (+0.01 on 30 rows)
#   squares below MIN_FLAT_IMAGE, for reference: wine first 9 -0.19, last 9 +0.05, first 4 +0.33;
#            diabetes first 9 +0.04; iris 4 +0.14 (a 2x2 grid has 4 neighbour pairs and 2 others: noise)
# 0.25 sits between the highest table (+0.13) and the lowest image (+0.42).
NEIGHBOUR_EXCESS = 0.25
# The widest square the test reads (its central window): bounded memory (a 32 x 32 window's correlation matrix is 8 MB).
MAX_SIDE = 32


@dataclass(frozen=True)
class ImageReading:
    """Whether inputs read as images, and why (for the console line that reports it)."""

    images: bool
    why: str


def read_images(train_x: Any) -> ImageReading:
    """Images: (N, C, H, W) or (N, H, W, C), (N, H, W), or (N, side * side) with side >= 4 whose neighbouring
    features correlate more than other pairs do (`neighbour_excess`); anything else (tables, token ids, text) is not."""
    shape = np.shape(train_x)
    if len(shape) in (3, 4):
        return ImageReading(True, f"a {len(shape)}-D batch: (N, H, W), (N, C, H, W) or (N, H, W, C)")
    side = math.isqrt(shape[1]) if len(shape) == 2 else 0
    if len(shape) != 2 or shape[1] < MIN_FLAT_IMAGE or side * side != shape[1]:
        return ImageReading(False, "not a 3-D or 4-D batch, nor rows of side * side >= 16 features")
    if not np.issubdtype(np.asarray(train_x).dtype, np.number):
        return ImageReading(False, "rows that are not numbers")
    excess = neighbour_excess(train_x)
    if excess is None:
        return ImageReading(True, f"rows of {side}x{side} features, too few rows to test their neighbours")
    images = excess > NEIGHBOUR_EXCESS
    return ImageReading(
        images,
        f"rows of {side}x{side} features whose adjacent pairs correlate {excess:+.2f} more than other pairs; "
        f"images: over {NEIGHBOUR_EXCESS}",
    )


def image_inputs(train_x: Any) -> bool:
    """Whether a task's train inputs look like images (see `read_images`)."""
    return read_images(train_x).images


def neighbour_excess(flat: Any) -> float | None:
    """The mean correlation of horizontally and vertically adjacent features of (N, side * side) rows laid out as
    side x side, minus the mean over all other pairs; constant features are left out. None: too few rows to say."""
    x = np.asarray(flat)
    x = x[np.linspace(0, len(x) - 1, min(len(x), SAMPLE_ROWS)).astype(int)].astype(np.float64)
    if len(x) < MIN_SAMPLE_ROWS:
        return None
    side = math.isqrt(x.shape[1])
    if side > MAX_SIDE:  # the central window: a 224 x 224 image's full correlation matrix would take 20 GB
        start = (side - MAX_SIDE) // 2
        x = x.reshape(len(x), side, side)[:, start : start + MAX_SIDE, start : start + MAX_SIDE].reshape(len(x), -1)
        side = MAX_SIDE
    # A missing value (NaN, inf) counts as its feature's mean: dropping rows left a table with one empty column no row
    # at all, and "too few rows" then read it as images (review)
    x = np.where(np.isfinite(x), x, np.nan)
    means = np.nanmean(np.where(np.isnan(x).all(axis=0), 0.0, x), axis=0)
    x = np.where(np.isnan(x), means, x)
    live = np.flatnonzero(x.std(axis=0) > 0)  # digits' always-blank corner pixels carry no correlation
    if len(live) < 2:
        return 0.0  # nothing varies together: no sign of an image
    corr = np.corrcoef(x[:, live], rowvar=False)
    grid = np.full(x.shape[1], -1)
    grid[live] = np.arange(len(live))
    grid = grid.reshape(side, side)
    adjacent = np.zeros_like(corr, dtype=bool)
    for a, b in ((grid[:, :-1], grid[:, 1:]), (grid[:-1, :], grid[1:, :])):
        both = (a >= 0) & (b >= 0)
        adjacent[a[both], b[both]] = adjacent[b[both], a[both]] = True
    others = ~adjacent & ~np.eye(len(live), dtype=bool)
    if not adjacent.any() or not others.any():
        return None
    return float(corr[adjacent].mean() - corr[others].mean())
