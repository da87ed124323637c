#!/usr/bin/env bash
# The engine's tests on a CUDA GPU: Triton kernels compiled for the device, decode and prefill graphs
# captured (the "captured" variants skip on a CPU). The whole log and a junit XML go to DIR, so a failure's
# traceback survives when the terminal only keeps the tail.
# Usage: engine/scripts/gpu_tests.sh DIR NAME [pytest args, default: tests/engine without the server tests]
# Example: engine/scripts/gpu_tests.sh "$OUT" main -n 8
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=$1 name=$2
shift 2
args=("$@")
has_path=0
for a in "${args[@]}"; do [[ $a == tests/* ]] && has_path=1; done
[ "$has_path" = 1 ] || args+=(tests/engine --ignore=tests/engine/server)
mkdir -p "$dir"
start=$(date +%s)
PYTHONPATH=engine${PYTHONPATH:+:$PYTHONPATH} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short \
    --timeout 600 --junitxml="$dir/$name.xml" "${args[@]}" >"$dir/$name.log" 2>&1
rc=$?
echo "$name: rc=$rc in $(( $(date +%s) - start )) s; $(tail -n 1 "$dir/$name.log")"
grep -E '^(FAILED|ERROR) ' "$dir/$name.log" | head -n 20
exit $rc
