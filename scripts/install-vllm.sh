#!/usr/bin/env bash
# Install vLLM 0.34.0's prefix-cache code (CPU only) and kvhit into a virtual environment.
#
# Usage: scripts/install-vllm.sh VENV_DIR
#
# Only the pure-Python parts that vllm.v1.core imports are installed: the vllm wheel itself
# goes in with --no-deps (its declared dependencies pull in CUDA builds and triton), and
# xgrammar likewise (a plain install drags in about 1 GB of triton).
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 VENV_DIR" >&2
    exit 2
fi
venv_dir=$1
repo_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ ! -x "$venv_dir/bin/python" ]]; then
    python3.11 -m venv "$venv_dir"
fi
pip=("$venv_dir/bin/python" -m pip install --quiet)

"${pip[@]}" torch==2.13.0
"${pip[@]}" -e "$repo_dir[test]"

wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
"$venv_dir/bin/python" -m pip download --quiet --no-deps --dest "$wheel_dir" vllm==0.34.0
"${pip[@]}" --no-deps "$wheel_dir"/vllm-*.whl

"${pip[@]}" packaging numpy pydantic psutil regex pyzmq urllib3 msgspec \
    "transformers>=5.16.1,<5.23.0" aiohttp requests pillow pybase64 cachetools cbor2 \
    cloudpickle uvloop py-cpuinfo prometheus_client "llguidance<1.8.0"
"${pip[@]}" --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.11

"$venv_dir/bin/python" -c "import vllm.v1.core.kv_cache_coordinator" 
echo "vLLM $("$venv_dir/bin/python" -c 'import vllm; print(vllm.__version__)') installed in $venv_dir"
