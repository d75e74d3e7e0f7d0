"""task.images: whether a task's inputs are images, set by its task.yaml or read from its prepared train inputs."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.ndimage import gaussian_filter
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, load_iris
from sklearn.preprocessing import StandardScaler

from ralph_ray.campaign import infer_images
from ralph_ray.config import load_config
from ralph_ray.scaffold import TEMPLATES_DIR
from ralph_ray.tasks import image_inputs, read_images

FASHION = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")


def test_image_inputs_reads_the_shape_of_real_arrays():
    """Images: (N, C, H, W) or (N, H, W, C), (N, H, W), or flattened squares of 16 features or more; else not."""
    digits = load_digits().data  # (1797, 64): 8x8 images, flattened
    assert image_inputs(digits)
    assert image_inputs(digits.reshape(-1, 8, 8))
    assert image_inputs(digits.reshape(-1, 1, 8, 8))
    assert image_inputs(digits.reshape(-1, 8, 8, 1))  # channels last, as cifar10's prepare returns them
    assert not image_inputs(load_breast_cancer().data)  # (569, 30): the user trial's table
    assert not image_inputs(load_diabetes().data)  # (442, 10)
    assert not image_inputs(load_iris().data)  # (150, 4): square, but a 2x2 "image" is a table row
    assert not image_inputs(load_digits().target)  # (N,): one value per input
    assert not image_inputs(["What is 2 + 3?", "What is 7 - 4?"])  # prompts


def _table(columns: slice) -> np.ndarray:
    """breast_cancer's columns, standardised, as a tabular trainer feeds them."""
    return StandardScaler().fit_transform(load_breast_cancer().data)[:, columns]


@pytest.mark.parametrize("columns", [slice(0, 25), slice(0, 16), slice(-16, None), slice(-25, None)])
def test_a_table_with_a_square_number_of_columns_is_not_read_as_images(columns: slice):
    """The user trial: 25 standardised breast_cancer columns read as 5x5 images, and `augmentation` shifted feature
    values between unrelated columns. Adjacent columns of a table correlate no more than other pairs (+0.07..+0.13)."""
    assert not image_inputs(_table(columns))
    assert not image_inputs(_table(columns)[:343])  # the user's train split's size
    assert not image_inputs(np.random.default_rng(0).normal(size=(500, 64)))  # 64 noise columns: not 8x8 images


def test_flattened_images_are_still_images():
    """digits flattened to 64 features (adjacent pixels +0.42 above other pairs), raw or standardised. Too few rows to
    measure: the shape decides, as before."""
    digits = load_digits().data
    assert image_inputs(digits) and image_inputs(StandardScaler().fit_transform(digits))
    assert image_inputs(digits[:5])


@pytest.mark.skipif(
    not FASHION.is_file(),
    reason=f"Fashion-MNIST's files are not installed ({FASHION}): apt-get install dataset-fashion-mnist",
)
def test_flattened_fashion_images_are_images():
    """Fashion-MNIST flattened to 784 features (+0.65), as bytes and as floats."""
    with gzip.open(FASHION) as f:
        fashion = np.frombuffer(f.read(16 + 3000 * 784), np.uint8, offset=16).reshape(-1, 784)
    assert image_inputs(fashion) and image_inputs(fashion.astype(np.float32) / 255)


def test_a_campaign_reads_task_images_from_the_inputs_only_where_the_task_leaves_it_unset():
    said: list[str] = []
    cfg = load_config(["task.images=null"])
    assert cfg.task.images is None
    infer_images(cfg, load_breast_cancer().data, said.append)
    assert cfg.task.images is False
    assert said[0].startswith("  task.images: inputs of shape (569, 30) read as not images (")
    assert said[0].endswith("; if that is wrong, set `task: {images: true}` in task.yaml")
    infer_images(cfg, load_digits().data, said.append)  # set: left as it is, nothing said
    assert cfg.task.images is False and len(said) == 1
    cfg = load_config(["task.images=null"])
    infer_images(cfg, load_digits().data, said.append)
    assert cfg.task.images is True and "(1797, 64) read as images (rows of 8x8 features" in said[-1]
    assert said[-1].endswith("; if that is wrong, set `task: {images: false}` in task.yaml")
    cfg = load_config(["task.images=null"])
    infer_images(cfg, _table(slice(0, 25)), said.append)
    assert cfg.task.images is False and "(569, 25) read as not images (rows of 5x5 features" in said[-1]
    assert said[-1].endswith("set `task: {images: true}` in task.yaml")


def test_task_yaml_still_wins_over_the_data():
    """A table forced to images (and digits forced not to be) keeps what task.yaml says, and nothing is said."""
    said: list[str] = []
    cfg = load_config(["task.images=true"])
    infer_images(cfg, _table(slice(0, 25)), said.append)
    assert cfg.task.images is True
    cfg = load_config(["task.images=false"])
    infer_images(cfg, load_digits().data, said.append)
    assert cfg.task.images is False and said == []


@pytest.mark.parametrize("template", ["classification", "regression"])
def test_the_table_templates_of_init_say_their_inputs_are_not_images(template: str):
    """Their stand-in data and MLP are for table rows: `images: false` is set, not left to the inference."""
    task = yaml.safe_load((TEMPLATES_DIR / template / "task.yaml").read_text())["task"]
    assert task["images"] is False


@pytest.mark.parametrize(
    ("task", "images"),
    [
        ("digits", True),
        ("fashion", True),
        ("cifar10", True),
        ("diabetes", False),
        ("lm", False),
        ("grpo", False),
        ("kto", False),
    ],
)
def test_shipped_tasks_say_whether_their_inputs_are_images(task: str, images: bool):
    """Nothing shipped depends on the inference: each task.yaml says it."""
    data = ["data.root=/nonexistent/cifar"] if task == "cifar10" else []  # its config only names the folder
    assert load_config([f"task={task}", *data]).task.images is images


def test_flat_rows_with_missing_values_one_live_feature_or_a_large_side_are_read_without_fault():
    """Review: one varying feature crashed the test (`np.corrcoef` of one column is 0-d), a table with an empty column
    lost every row to NaN and read as images ("too few rows"), and a flat 224 x 224 image's full correlation matrix
    would take 20 GB."""
    rng = np.random.default_rng(0)
    table = rng.normal(size=(500, 36))
    table[:, 3] = np.nan
    assert not read_images(table).images
    one = np.zeros((50, 16))
    one[:, 2] = np.arange(50)
    assert not read_images(one).images
    smooth = gaussian_filter(rng.normal(size=(40, 224, 224)), sigma=(0, 2, 2))  # neighbours alike, far ones not
    assert read_images(smooth.reshape(40, -1).astype(np.float32)).images
    assert not read_images(rng.normal(size=(40, 224 * 224)).astype(np.float32)).images
