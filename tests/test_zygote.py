"""The fork server's own helpers, apart from the warm path that tests/test_warmstart.py drives end to end."""

from __future__ import annotations

import ctypes.util
import shutil
from pathlib import Path

import pytest

from ralph_ray import zygote


def _a_real_library() -> Path:
    found = ctypes.util.find_library("z")
    if found is None:
        pytest.fail("zlib's shared library is not on this machine (Debian: libz1 is essential)")
    for folder in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib64"):
        if (Path(folder) / found).exists():
            return Path(folder) / found
    pytest.fail(f"{found} not found in the usual folders")


def test_the_server_opens_every_sibling_of_the_loaded_cudnn_and_nothing_else(tmp_path: Path):
    """Given a process map that shows libcudnn.so.9 loaded from a folder, the cuDNN sub-libraries beside it are
    dlopened (they appear in this process's real map afterwards); other libraries there and broken files are not."""
    library = _a_real_library()
    folder = tmp_path / "nvidia" / "cudnn" / "lib"
    folder.mkdir(parents=True)
    for name in ("libcudnn.so.9", "libcudnn_engines_fake.so.9", "libcudnn_ops_fake.so.9", "libcublas_fake.so.12"):
        shutil.copy(library, folder / name)
    (folder / "libcudnn_broken.so.9").write_bytes(b"not an ELF file")
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f0000000000-7f0000001000 r-xp 00000000 08:01 1 {folder / 'libcudnn.so.9'}\n"
        "7f0000002000-7f0000003000 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
    )
    opened = zygote.open_cudnn_libraries(str(maps))
    assert opened == [str(folder / "libcudnn_engines_fake.so.9"), str(folder / "libcudnn_ops_fake.so.9")]
    mapped = Path("/proc/self/maps").read_text()
    assert str(folder / "libcudnn_engines_fake.so.9") in mapped
    assert str(folder / "libcublas_fake.so.12") not in mapped


def test_without_cudnn_loaded_the_server_opens_nothing(tmp_path: Path):
    """A process map without libcudnn.so (a CPU build of torch): nothing to open."""
    maps = tmp_path / "maps"
    maps.write_text("7f0000002000-7f0000003000 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert zygote.open_cudnn_libraries(str(maps)) == []
