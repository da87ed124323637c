# hosttune status: read-only. The host's clock and what each monitor pass last wrote, as probe sections.
# Sent as-is to every host; no inventory value is ever put into it.
# A section's code: 0 the file read, 3 no such file (the pass never wrote one), else cat's (its error is the text).
d=/var/lib/hosttune/monitor
printf '@@ht:now\n%s\n@@ht-end:now:0\n' "$(date +%s)"
# the name and machine-id the monitor's probe reads (a status file must be this host's, not one a cloned disk brought
# along: a clone may keep the name, and is given its own machine-id where it is made as systemd asks)
printf '@@ht:hostname\n%s\n@@ht-end:hostname:0\n' "$(cat /proc/sys/kernel/hostname 2>/dev/null || cat /etc/hostname 2>/dev/null)"
printf '@@ht:machine_id\n%s\n@@ht-end:machine_id:0\n' "$(cat /etc/machine-id 2>/dev/null)"
# as the probe reads them: where that id lives (one made up at every boot names no machine), and the GPUs' UUIDs
# (a machine whose id was made anew keeps its GPUs; a clone runs on another machine's)
printf '@@ht:machine_id_store\n'
grep -qs '^[^ ]* [^ ]* [^ ]* [^ ]* /etc/machine-id ' /proc/self/mountinfo && printf 'machine-id-mount:1\n'
printf 'machine-id-fs:%s\n@@ht-end:machine_id_store:0\n' "$(stat -f -c %T /etc/machine-id 2>/dev/null)"
printf '@@ht:gpus\n'
sed -n 's/^GPU UUID:[[:space:]]*//p' /proc/driver/nvidia/gpus/*/information 2>/dev/null
printf '@@ht-end:gpus:0\n'
for p in regular active; do
  f=$d/status.json; [ $p = active ] && f=$d/status-active.json
  printf '@@ht:%s\n' $p
  if [ -e "$f" ]; then cat "$f" 2>&1; r=$?; else r=3; fi
  printf '\n@@ht-end:%s:%s\n' $p $r
done
exit 0
