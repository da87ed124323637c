#!/usr/bin/env bash
# Evidence for `hosttune check` on the lent H200 host (local transport, no paramiko there).
# Runs the check idle and again while a GPU matmul loop keeps the GPU busy.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/h200-out}; mkdir -p "$out"
export PYTHONPATH=$PWD
py=python3
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
$py -c 'from hosttune.probes.gather import probe_script; import sys; sys.stdout.buffer.write(probe_script())' > /tmp/probe.sh
/usr/bin/time -f "%e s" sh -s < /tmp/probe.sh > "$out/probe-output.txt" 2> "$out/probe-time.txt"
$py -m hosttune check -i inventories/h200.yaml > "$out/check-idle.txt"; echo "exit $?" >> "$out/check-idle.txt"
$py -m hosttune check -i inventories/h200.yaml --format json > "$out/check-idle.json"
$py -m hosttune facts -i inventories/h200.yaml > "$out/facts.json"
$py - <<'PY' &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 20
while time.time() < end:
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
PY
load=$!
sleep 8
$py -m hosttune check -i inventories/h200.yaml > "$out/check-load.txt"; echo "exit $?" >> "$out/check-load.txt"
wait $load
$py -m hosttune apply --help >/dev/null 2>&1 && $py -m hosttune apply -i inventories/h200.yaml --dry-run > "$out/apply-dry-run.txt" 2>&1
for f in "$out"/check-*.txt; do echo "== $f"; cat "$f"; done
cat "$out/probe-time.txt"
