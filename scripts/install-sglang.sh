#!/usr/bin/env bash
# Install SGLang 0.5.23's radix caches (CPU only) and kvhit into a virtual environment.
#
# Usage: scripts/install-sglang.sh VENV_DIR     (PYTHON picks the interpreter, default python3.11)
#
# Creates VENV_DIR if needed, else installs into it. The sglang wheel goes in with
# --no-deps (its declared dependencies pull CUDA builds and torch 2.14.1; torch stays at
# constraints.txt's CPU build here), then only what
# `import sglang.srt.mem_cache.unified_radix_cache`, the cache's construction and
# `import sglang.srt.managers.scheduler` (the step-level engine) need: found by
# importing and adding what was missing.
# triton (about 1 GB on disk) is imported at the top of sglang.srt.utils, and
# torchvision by its model configs; both go in with --no-deps so torch is untouched.
# pip then lists sglang's declared dependencies it did not get: expected.
# About 2.8 GB (1 GB of it triton) and 70 s.
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 VENV_DIR" >&2
    exit 2
fi
venv_dir=$1
repo_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ ! -x "$venv_dir/bin/python" ]]; then
    "${PYTHON:-python3.11}" -m venv "$venv_dir"
fi
python=("$venv_dir/bin/python" -m pip --disable-pip-version-check)
install=("${python[@]}" install --quiet -c "$repo_dir/constraints.txt")

"${install[@]}" torch
"${install[@]}" -e "$repo_dir[test]"

wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
"${python[@]}" download --quiet --no-deps --dest "$wheel_dir" sglang==0.5.23
"${install[@]}" --no-deps "$wheel_dir"/sglang-0.5.23-*.whl

"${install[@]}" torch numpy orjson psutil pybase64 requests pillow starlette \
    msgspec pydantic pyzmq tqdm aiohttp IPython dill sentencepiece gguf openai \
    partial_json_parser "transformers==5.19.0" compressed-tensors \
    setproctitle einops uvicorn fastapi
"${install[@]}" --no-deps triton==3.9.0 torchvision==0.28.0 apache-tvm-ffi==0.1.11

"$venv_dir/bin/python" -c "import kvhit.engines.sglang.scheduler_engine"
version=$("$venv_dir/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang"))')
echo "SGLang $version and kvhit installed in $venv_dir"
