#!/usr/bin/env bash
# Build what a GPU device call carries (the device reaches no package registry; a call carries 64 MiB at most):
#   .gpu/      ray (unzipped, minus jars/rllib/serve/llm/the dashboard's web build, binaries stripped, tar.xz: 19 MB),
#              duckdb (tar.xz: 16 MB), antlr4 4.9.3 (sdist only: copied from this venv) and the other missing wheels
#   .gpudata/  Fashion-MNIST's four idx files (tar.xz: 26 MB), from Debian's dataset-fashion-mnist
#   .gpudiag/  the 10k test files twice (as train and test: a small real-format set for quick checks)
# The two big folders don't fit one call together: call A carries .gpu (bench/device/setup.sh unpacks it into
# /tmp/site-packages, kept while the machine stays warm, 30 s), call B at once carries .gpudata (bench/device/fashion.sh).
# Run from the repo root: bash bench/device/pack.sh
set -euo pipefail
V=.venv/bin/python
ver() { $V -c "import importlib.metadata as m; print(m.version('$1'))"; }
grep -qx "/.gpu/" "$(git rev-parse --git-path info/exclude)" 2>/dev/null \
  || printf '/.gpu/\n/.gpudata/\n/.gpudiag/\n' >> "$(git rev-parse --git-path info/exclude)"
tmp=$(mktemp -d); mkdir -p .gpu .gpudata .gpudiag
pkgs=(ray duckdb optuna hydra-core omegaconf libcst alembic SQLAlchemy colorlog pydantic pydantic_core annotated-types
      typing-inspection jsonschema jsonschema-specifications referencing rpds-py tensorboardX pytz dill platformdirs
      sniffio typing_extensions)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$tmp/whl" \
  $(for p in "${pkgs[@]}"; do echo "$p==$(ver "$p")"; done)
(mkdir "$tmp/ray" && cd "$tmp/ray" && unzip -q "$tmp"/whl/ray-*.whl && rm -rf ray/jars ray/rllib ray/serve ray/llm \
  ray/dashboard/client/build && strip --strip-unneeded ray/_raylet.so ray/core/src/ray/gcs/gcs_server \
  ray/core/src/ray/raylet/raylet && tar cf - . | xz -T0 -9 > "$OLDPWD/.gpu/ray.tar.xz")
(mkdir "$tmp/duckdb" && cd "$tmp/duckdb" && unzip -q "$tmp"/whl/duckdb-*.whl && tar cf - . | xz -T0 -9 > "$OLDPWD/.gpu/duckdb.tar.xz")
rm "$tmp"/whl/ray-*.whl "$tmp"/whl/duckdb-*.whl && cp "$tmp"/whl/*.whl .gpu/
site=$($V -c "import antlr4, pathlib; print(pathlib.Path(antlr4.__file__).parent.parent)")
tar cJf .gpu/antlr.tar.xz -C "$site" antlr4 antlr4_python3_runtime-4.9.3.dist-info
fm=/usr/share/datasets/fashion-mnist
mkdir "$tmp/fm" && for f in "$fm"/*.gz; do zcat "$f" > "$tmp/fm/$(basename "$f" .gz)"; done
tar cf - -C "$tmp/fm" . | xz -T0 -9e > .gpudata/fm.tar.xz
cp "$fm"/t10k-* .gpudiag/ && cp "$fm"/t10k-images-idx3-ubyte.gz .gpudiag/train-images-idx3-ubyte.gz \
  && cp "$fm"/t10k-labels-idx1-ubyte.gz .gpudiag/train-labels-idx1-ubyte.gz
# .gpupost/: the post-training task's packages the device image lacks (trl, datasets, multiprocess, gguf) and pyarrow
# (datasets needs >= 24; the image's version is not on record), 55 MB, for bench/device/posttrain.sh; the image's
# transformers, peft, tokenizers and accelerate serve.
exclude=$(git rev-parse --git-path info/exclude)  # a worktree's .git is a file
grep -qx "/.gpupost/" "$exclude" || echo "/.gpupost/" >> "$exclude"
mkdir -p .gpupost && python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpupost \
  $(for p in trl datasets multiprocess dill gguf pyarrow; do echo "$p==$(ver "$p")"; done)
rm -rf "$tmp"; du -sh .gpu .gpudata .gpudiag .gpupost
