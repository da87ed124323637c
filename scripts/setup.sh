#!/usr/bin/env bash
# Set up the control plane in ./.venv (no torch, no GPU libraries needed).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e .
