"""Which files a task's prepare() reads where trials could read them too (tasks/reads.py), on real opens."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from ralph_ray.tasks import reads


def test_the_audit_hook_records_what_is_opened_while_listening_only(tmp_path: Path):
    data, later = tmp_path / "labels.csv.gz", tmp_path / "later.csv"
    with gzip.open(data, "wt") as out:
        out.write("1,2\n")
    later.write_text("3\n")
    with reads.recording() as opened:
        np.loadtxt(data, delimiter=",")
    later.read_text()  # after the block: not recorded
    assert str(data) in opened and str(later) not in opened


def test_only_data_files_in_folders_trials_see_and_not_hidden_yet_are_exposed(tmp_path: Path):
    bound, elsewhere = tmp_path / "venv", tmp_path / "home"
    site = bound / "lib" / "python3.11" / "site-packages"
    for folder in (bound / "share" / "raw", site / "x-1.0.dist-info", site / "certifi", bound / "hidden", elsewhere):
        folder.mkdir(parents=True)
    files = {
        "labels": bound / "share" / "raw" / "t10k-labels-idx1-ubyte.gz",  # raw data in the environment: exposed
        "code": bound / "lib" / "module.py",  # an import: never hidden (the trials import it too)
        "native": bound / "lib" / "_ext.cpython-311-x86_64-linux-gnu.so",
        # a package's files (importlib.metadata reads every entry_points.txt): what trials run on, not data
        "metadata": bound / "lib" / "python3.11" / "site-packages" / "x-1.0.dist-info" / "entry_points.txt",
        "package": bound / "lib" / "python3.11" / "site-packages" / "certifi" / "cacert.pem",
        "declared": bound / "hidden" / "test.csv",  # already hidden (hidden_paths)
        "outside": elsewhere / "all.csv",  # in no folder a trial sees
    }
    for path in files.values():
        path.write_text("x")
    opened = [str(p) for p in files.values()] + ["/etc/hosts", str(bound / "share" / "raw")]  # config; a folder
    assert reads.exposed(opened, [bound], [bound / "hidden"]) == [files["labels"]]
    # a hidden folder that holds the bound one (the project root around its .venv) covers nothing in the jail (CI)
    assert reads.exposed(opened, [bound], [bound / "hidden", tmp_path]) == [files["labels"]]


def test_many_files_of_one_folder_are_hidden_as_the_folder(tmp_path: Path):
    """Review: an image folder under /opt, every file opened by prepare(), put a bind per file on every trial's
    command line (past the kernel's argument limit)."""
    bound = tmp_path / "opt"
    images, few = bound / "data" / "images", bound / "data" / "labels"
    for folder in (images, few):
        folder.mkdir(parents=True)
    opened = []
    for i in range(reads.FILES_PER_FOLDER + 1):
        (images / f"{i}.png").write_text("x")
        opened.append(str(images / f"{i}.png"))
    (few / "test.csv").write_text("x")
    opened.append(str(few / "test.csv"))
    assert reads.exposed(opened, [bound], []) == [images, few / "test.csv"]
    torch_saved = bound / "data" / "test.pth"  # a dataset torch.save wrote: data, though site's .pth files are not
    torch_saved.write_text("x")
    assert reads.exposed([str(torch_saved)], [bound], []) == [torch_saved]
