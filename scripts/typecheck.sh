#!/usr/bin/env bash
# Type-check the kvhit package as it installs (the folders map to kvhit.* only once
# installed): a plain copy into a temporary folder, then mypy over kvhit with the
# settings in pyproject.toml. Run it from the repository, in a venv with the test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
pip install --quiet --no-deps --no-build-isolation --target "$site" . >/dev/null
MYPYPATH="$site" mypy --config-file pyproject.toml -p kvhit
