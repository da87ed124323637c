#!/usr/bin/env bash
# Evidence for `hosttune apply --dry-run` on the lent H200 host (local transport, no
# paramiko there): the plan it prints, and proof that the dry run changed nothing.
# Output goes to $OUT (default /tmp/h200-apply-out).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/h200-apply-out}; mkdir -p "$out"
export PYTHONPATH=$PWD
py=python3

# What a dry run must leave alone: files under these trees, and the GPU's IRQ affinities.
watched="/etc /boot /usr/local/sbin /usr/local/bin /var/lib/hosttune"
irqs() { for f in /proc/irq/*/smp_affinity_list; do printf '%s %s\n' "$f" "$(cat "$f" 2>/dev/null)"; done; }
marker=$(mktemp); sleep 1
irqs > "$out/irq-before.txt"
[ -e /var/lib/hosttune ] && echo "/var/lib/hosttune existed before" > "$out/var-lib-hosttune-before.txt"

/usr/bin/time -f "%e s" $py -m hosttune apply -i inventories/h200.yaml --dry-run > "$out/apply-dry-run.txt" 2> "$out/apply-dry-run.stderr"
echo "exit $?" >> "$out/apply-dry-run.txt"
$py -m hosttune apply -i inventories/h200.yaml --dry-run --format json > "$out/apply-dry-run.json" 2>> "$out/apply-dry-run.stderr"

if grep -q "ModuleNotFoundError" "$out/apply-dry-run.stderr"; then
    # A CLI module's dependency is missing on this host: plan through the library instead.
    $py - > "$out/apply-dry-run-library.txt" 2>&1 <<'PY'
from hosttune.execute.rollout import ApplyOptions, plan_fleet
from hosttune.fleet import profiles
from hosttune.config.inventory import load_inventory
from hosttune.plan.render import render
inv = load_inventory("inventories/h200.yaml")
print(render(plan_fleet(inv, profiles(inv), ApplyOptions())))
PY
fi

irqs > "$out/irq-after.txt"
{
    echo "files modified during the dry run under: $watched"
    find $watched -xdev -newer "$marker" -type f 2>/dev/null
    echo "(end of list)"
    if cmp -s "$out/irq-before.txt" "$out/irq-after.txt"; then echo "IRQ affinities: unchanged"; else echo "IRQ affinities: CHANGED"; diff "$out/irq-before.txt" "$out/irq-after.txt"; fi
    if [ -e /var/lib/hosttune ] && [ ! -e "$out/var-lib-hosttune-before.txt" ]; then echo "/var/lib/hosttune: CREATED"; else echo "/var/lib/hosttune: not created"; fi
} > "$out/unchanged.txt"
rm -f "$marker"
cat "$out/apply-dry-run.txt" "$out/unchanged.txt"
[ -s "$out/apply-dry-run.stderr" ] && { echo "== stderr"; cat "$out/apply-dry-run.stderr"; }
exit 0
