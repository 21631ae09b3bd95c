#!/usr/bin/env bash
# Prints the command to run uv with, installing uv from PyPI (pinned) when it is missing.
set -euo pipefail
UV_VERSION=0.13.9
if command -v uv >/dev/null 2>&1; then echo uv; exit 0; fi
if python3 -m uv --version >/dev/null 2>&1; then echo "python3 -m uv"; exit 0; fi
python3 -m pip install --quiet "uv==${UV_VERSION}" >&2 || python3 -m pip install --quiet --user "uv==${UV_VERSION}" >&2
echo "python3 -m uv"
