"""task.images: whether a task's inputs are images, set by its task.yaml or read from its prepared train inputs."""

from __future__ import annotations

import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, load_iris

from ralph_ray.campaign import infer_images
from ralph_ray.config import load_config
from ralph_ray.tasks import image_inputs


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


def test_a_campaign_reads_task_images_from_the_inputs_only_where_the_task_leaves_it_unset():
    said: list[str] = []
    cfg = load_config(["task.images=null"])
    assert cfg.task.images is None
    infer_images(cfg, load_breast_cancer().data, said.append)
    assert cfg.task.images is False
    assert said == ["  task.images: inputs of shape (569, 30) read as not images (task.images in task.yaml decides)"]
    infer_images(cfg, load_digits().data, said.append)  # set: left as it is, nothing said
    assert cfg.task.images is False and len(said) == 1
    cfg = load_config(["task.images=null"])
    infer_images(cfg, load_digits().data, said.append)
    assert cfg.task.images is True and said[-1].endswith("(1797, 64) read as images (task.images in task.yaml decides)")


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
