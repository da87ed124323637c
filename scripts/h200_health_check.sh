#!/usr/bin/env bash
# Record the GPU health checks on a GPU host, through the local transport, into $OUT:
#   check.txt/.json            hosttune check -v (passive: what every check reads without load)
#   check-active.txt/.json     hosttune check --active -v (a few seconds of GPU load, DCGM's quick
#                              diagnostic where installed, all-reduce bandwidth on several GPUs)
#   facts-active.json          the facts of an active check, the load samples among them
#   probe-output.txt           the probe script's raw output (passive), and its wall time
#   probe-output-active.txt    the same with the active probes, and its wall time
#   imports.txt                the modules a local check loads (no paramiko, no pydantic)
#   nvidia-smi-q.xml, nvlink-status.txt, nvlink-errors.txt, xid-lines.txt: raw outputs for fixtures
# Changes no setting of the host: no clock, power, persistence or driver setting is touched.
# Usage: OUT=/some/dir PYTHONPATH=$PWD bash scripts/h200_health_check.sh [inventory (default inventories/h200.yaml)]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?set OUT to the folder for the recorded files}; mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
inv=${1:-inventories/h200.yaml}  # the H200's pins; pass "" for the built-in localhost
[ -z "$inv" ] || [ -f "$inv" ] || { echo "no inventory $inv" >&2; exit 2; }
args=(); [ -n "$inv" ] && args=(--inventory "$inv")

$py - > "$out/imports.txt" 2>&1 <<'PY'
import sys
from hosttune.cli import app  # noqa: F401  (every command module, as `hosttune check` loads them)
from hosttune.fleet import probe
from hosttune.config.inventory import local_inventory
probe(local_inventory().hosts[0])
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("paramiko", "pydantic", "torch"))
print("modules loaded by a local probe that should not be:", bad or "none")
sys.exit(1 if bad else 0)
PY
echo "exit $?" >> "$out/imports.txt"

for active in 0 6; do
  name=probe-output$([ $active = 0 ] || echo -active)
  $py -c "import sys; from hosttune.probes.gather import probe_script; sys.stdout.buffer.write(probe_script($active))" > "$out/$name.sh"
  start=$(date +%s%N)
  sh -s < "$out/$name.sh" > "$out/$name.txt" 2> "$out/$name.stderr"
  echo "exit $? in $(( ($(date +%s%N) - start) / 1000000 )) ms" > "$out/$name.time"
  rm -f "$out/$name.sh"
done

$py -m hosttune check "${args[@]}" -v > "$out/check.txt" 2>&1; echo "exit $?" >> "$out/check.txt"
$py -m hosttune check "${args[@]}" --format json -o "$out/check.json" 2>/dev/null
$py -m hosttune check "${args[@]}" --active -v > "$out/check-active.txt" 2>&1; echo "exit $?" >> "$out/check-active.txt"
$py -m hosttune check "${args[@]}" --active --format json -o "$out/check-active.json" 2>/dev/null
$py - "$out/facts-active.json" "${args[@]}" <<'PY'
import json, sys
from dataclasses import asdict
from hosttune.fleet import probe
from hosttune.config.inventory import load_inventory, local_inventory
inv = load_inventory(sys.argv[3]) if len(sys.argv) > 3 else local_inventory()
facts, timings = probe(inv.hosts[0], active_s=6)
with open(sys.argv[1], "w") as f:
    json.dump({"timings": asdict(timings), "health": asdict(facts.health), "gpus": [asdict(g) for g in facts.gpu.gpus]}, f, indent=1)
PY

if command -v nvidia-smi >/dev/null; then
  nvidia-smi -q -x > "$out/nvidia-smi-q.xml" 2>&1
  nvidia-smi nvlink -s > "$out/nvlink-status.txt" 2>&1; echo "exit $?" >> "$out/nvlink-status.txt"
  nvidia-smi nvlink -e > "$out/nvlink-errors.txt" 2>&1; echo "exit $?" >> "$out/nvlink-errors.txt"
fi
{ dmesg 2>&1 | grep -E 'NVRM|Xid' | tail -n 50; echo "exit $?"; } > "$out/xid-lines.txt"
for f in imports.txt probe-output.time probe-output-active.time check.txt check-active.txt; do echo "== $f"; cat "$out/$f"; done
