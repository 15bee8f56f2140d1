#!/usr/bin/env bash
# Install one or more vLLM releases side by side (CPU only), sharing one environment.
#
# Usage: scripts/install-vllm.sh VENV_DIR [RELEASE ...]     (default release: 0.34.0;
#        PYTHON picks the interpreter, default python3.11)
#
# VENV_DIR is one virtual environment holding torch (constraints.txt: this machine's CPU
# build), kvhit and the pure-Python packages that vllm.v1.core imports. Each release's
# wheel goes in with --no-deps into its own folder, VENV_DIR/vllm/RELEASE (its declared
# dependencies pull in CUDA builds); `kvhit matrix --vllm RELEASE,...` puts that folder
# first on the path. The first release given is also installed into the environment
# itself, so `VENV_DIR/bin/kvhit gate --target vllm` and `VENV_DIR/bin/pytest tests_vllm`
# use it with no path set.
# A release already in its folder is not downloaded again.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 VENV_DIR [RELEASE ...]" >&2
    exit 2
fi
venv_dir=$1
shift
releases=("${@:-0.34.0}")
repo_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

for release in "${releases[@]}"; do
    if [[ ! $release =~ ^0\.[0-9]+\.[0-9]+$ ]]; then
        echo "$0: $release is not a vLLM release number like 0.34.0" >&2
        exit 2
    fi
done

if [[ ! -x "$venv_dir/bin/python" ]]; then
    "${PYTHON:-python3.11}" -m venv "$venv_dir"
fi
python=("$venv_dir/bin/python" -m pip --disable-pip-version-check)
install=("${python[@]}" install --quiet -c "$repo_dir/constraints.txt")

"${install[@]}" torch
"${install[@]}" -e "$repo_dir[test]"
# What vllm.v1.core imports, in every release from 0.14.0 to 0.34.0: found by importing
# the adapter under each release and adding what was missing (einops: the scheduler's
# imports in 0.29.0 and 0.30.0, for the vllm-connector target). xgrammar goes in with
# --no-deps (a plain install drags in about 1 GB of triton).
"${install[@]}" packaging numpy pydantic psutil regex pyzmq urllib3 msgspec \
    "transformers>=5.16.1,<5.23.0" aiohttp requests pillow pybase64 cachetools cbor2 \
    cloudpickle uvloop py-cpuinfo prometheus_client "llguidance<1.8.0" \
    gguf openai-harmony openai blake3 mistral_common diskcache fastapi partial-json-parser einops
"${install[@]}" --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.11

wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
for release in "${releases[@]}"; do
    target="$venv_dir/vllm/$release"
    if [[ -f "$target/vllm/v1/core/kv_cache_coordinator.py" ]]; then
        echo "vLLM $release: already in $target"
        continue
    fi
    start=$SECONDS
    "${python[@]}" download --quiet --no-deps --dest "$wheel_dir" "vllm==$release"
    wheel=$(ls "$wheel_dir"/vllm-"$release"-*.whl)
    "${install[@]}" --no-deps --target "$target" "$wheel"
    rm -f "$wheel"
    # The compiled kernels (CUDA builds, 30-96% of the folder) are never loaded: the
    # prefix-cache lookup is pure Python.
    find "$target" -name '*.so' -delete
    echo "vLLM $release: $(du -sh "$target" | cut -f1) in $target, $((SECONDS - start)) s"
done

first="$venv_dir/vllm/${releases[0]}"
site=$("$venv_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$(cd "$first" && pwd)" > "$site/kvhit-vllm-default.pth"
"$venv_dir/bin/python" -c "import kvhit.engines.vllm.target"
echo "kvhit and vLLM ${releases[*]} installed in $venv_dir (default: ${releases[0]})"
