"""ralph_ray: a population-based experimenter for deep-learning training code, distributed with Ray."""

from pathlib import Path

# Editable installs keep conf/ and trainers/ beside the package; the engine finds them from here.
PROJECT_ROOT = Path(__file__).resolve().parent.parent

__version__ = "0.1.0"
