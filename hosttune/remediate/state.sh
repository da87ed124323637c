# hosttune remediate: what a host's serving looks like to the remediation ladder (read-only).
# Run as: sh -c "$SCRIPT" hosttune. Prints "key:value" lines, JSON on one line.
set -u
cordon=/var/lib/hosttune/cordon.json
ledger=/var/lib/hosttune/remediate/ledger.json
meta=/opt/hosttune/current/.hosttune
printf 'boot:%s/%s\n' "$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)" "$(cut -d' ' -f22 /proc/1/stat 2>/dev/null)"
[ -f "$cordon" ] && printf 'cordon:%s\n' "$(tr -d '\n' < "$cordon")"
[ -f "$ledger" ] && printf 'ledger:%s\n' "$(tr -d '\n' < "$ledger")"
[ -f "$meta/replicas.json" ] && printf 'replicas:%s\n' "$(tr -d '\n' < "$meta/replicas.json")"
[ -f "$meta/replica_lb.py" ] && printf 'lb:%s\n' "$(readlink -f "$meta/replica_lb.py")"
for u in hosttune-serve.service hosttune-ray.service; do
    [ -f "/etc/systemd/system/$u" ] && printf 'unit:%s %s\n' "$u" "$(systemctl is-active "$u" 2>/dev/null)"
done
systemctl list-units --all --plain --no-legend 'hosttune-engine@*.service' 2>/dev/null | while read -r u load active rest; do
    printf 'unit:%s %s\n' "$u" "$active"
done
exit 0
