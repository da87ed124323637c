#!/usr/bin/env bash
# `hosttune deploy` on an H200 host, whose PID 1 is
# not systemd, refuses before changing anything and says why (docs/deploy.md, "Hosts without
# systemd"). Local transport: no paramiko needed there. Output lands in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/h200-deploy-out}; mkdir -p "$out"
export PYTHONPATH=$PWD
state() { ls -la /opt/hosttune /etc/systemd/system/hosttune-serve.service 2>&1; }
{ echo "PID 1: $(cat /proc/1/comm)"; python3 --version; } > "$out/host.txt" 2>&1
state > "$out/before.txt"
PYTHONPATH=. python3 -m hosttune deploy --engine custom --gpus 0 --model /tmp/none -i inventories/h200.yaml \
    > "$out/deploy.txt" 2>&1
echo "exit $?" >> "$out/deploy.txt"
state > "$out/after.txt"
if cmp -s "$out/before.txt" "$out/after.txt"; then echo "nothing changed" >> "$out/deploy.txt"; else echo "STATE CHANGED" >> "$out/deploy.txt"; fi
cat "$out/host.txt" "$out/deploy.txt"
