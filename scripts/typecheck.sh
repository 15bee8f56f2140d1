#!/usr/bin/env bash
# Type-check the kvhit package as it installs (the folders map to kvhit.* only once
# installed): a plain copy into a temporary folder, then mypy over kvhit with the
# settings in pyproject.toml. Run it from the repository, in a venv with the test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
# setuptools copies through build/, where a module deleted since the last build would
# survive and be checked: start from the sources alone.
rm -rf build
pip install --quiet --no-deps --no-build-isolation --target "$site" . >/dev/null
MYPYPATH="$site" mypy --config-file pyproject.toml -p kvhit
