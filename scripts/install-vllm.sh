#!/usr/bin/env bash
# Install vLLM 0.34.0's prefix-cache code (CPU only) and kvhit into a virtual environment.
#
# Usage: scripts/install-vllm.sh VENV_DIR     (PYTHON picks the interpreter, default python3.11)
#
# Creates VENV_DIR if needed, else installs into it. Only the pure-Python packages that
# vllm.v1.core imports are installed: the vllm wheel goes in with --no-deps (its declared
# dependencies pull in CUDA builds), and so does xgrammar (a plain install drags in about
# 1 GB of triton). pip then lists vllm's declared dependencies it did not get: expected.
# About 2 GB and 90 s.
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
install=("${python[@]}" install --quiet)

"${install[@]}" torch==2.13.0
"${install[@]}" -e "$repo_dir[test]"

wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
"${python[@]}" download --quiet --no-deps --dest "$wheel_dir" vllm==0.34.0
"${install[@]}" --no-deps "$wheel_dir"/vllm-0.34.0-*.whl

"${install[@]}" packaging numpy pydantic psutil regex pyzmq urllib3 msgspec \
    "transformers>=5.16.1,<5.23.0" aiohttp requests pillow pybase64 cachetools cbor2 \
    cloudpickle uvloop py-cpuinfo prometheus_client "llguidance<1.8.0"
"${install[@]}" --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.11

"$venv_dir/bin/python" -c "import kvhit.adapters.vllm"
echo "vLLM $("$venv_dir/bin/python" -c 'import vllm; print(vllm.__version__)') and kvhit installed in $venv_dir"
