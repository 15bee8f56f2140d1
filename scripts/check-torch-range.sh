#!/usr/bin/env bash
# Show that pip accepts kvhit beside the torch a vLLM release pins: read the pin from the
# release's own wheel metadata, then ask pip's resolver (a dry run: nothing is installed)
# for kvhit and exactly that torch together. Exit 0 when the resolver picks both.
#
# Usage: scripts/check-torch-range.sh VLLM_FOLDER   (a release folder that
#        scripts/install-vllm.sh made, e.g. .venv-vllm/vllm/0.34.0). About a minute: pip
#        reads torch's metadata from the package index.
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 VLLM_FOLDER" >&2
    exit 2
fi
repo_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
metadata=$(ls "$1"/vllm-*.dist-info/METADATA)
pin=$(sed -n 's/^Requires-Dist: torch==\([0-9.]*\).*/\1/p' "$metadata" | head -1)
if [[ -z $pin ]]; then
    echo "$0: $metadata pins no torch version" >&2
    exit 1
fi
report=$(mktemp)
trap 'rm -f "$report"' EXIT
python3 -m pip install --disable-pip-version-check --quiet --dry-run --ignore-installed \
    --report "$report" "$repo_dir" "torch==$pin" 2> >(grep -v "is ignored" >&2)
python3 - "$report" "$pin" "$(basename "$(dirname "$metadata")" .dist-info)" <<'PY'
import json
import sys

report, pin, release = sys.argv[1:]
picked = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.load(open(report))["install"]}
if picked.get("torch") != pin or "kvhit" not in picked:
    sys.exit(f"pip did not resolve kvhit with torch {pin}: {picked}")
print(f"pip resolves kvhit {picked['kvhit']} beside torch {pin}, the torch {release} pins")
PY
