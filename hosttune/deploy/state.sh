# hosttune deploy: what a host has now (read-only). Run as: sh -c "$SCRIPT" hosttune RELEASE_ID WHEEL_PATH...
# Prints "key:value" lines; every value arrives as an argument, never as code.
# The paths are wheels and the host files a release writes (nginx): each one there is hashed.
set -u
root=/opt/hosttune
id=$1; shift
printf 'current:%s\n' "$(readlink -- "$root/current" 2>/dev/null)"
printf 'previous:%s\n' "$(readlink -- "$root/previous" 2>/dev/null)"
[ -f "$root/releases/$id/.hosttune/release.json" ] && printf 'complete:%s\n' "$id"
# Complete releases and the wheel set each was installed from (a new release with the same set is cloned).
for d in "$root"/releases/*/; do
    d=${d%/}
    [ -f "$d/.hosttune/release.json" ] && [ -f "$d/.hosttune/wheelset" ] && printf 'installed:%s %s\n' "$(cat -- "$d/.hosttune/wheelset")" "$d"
done
# Every release folder, complete or not, with when it was written (its release.json, else the folder): the oldest
# beyond what deploy keeps are removed once a new release serves.
for d in "$root"/releases/*/; do
    [ -d "$d" ] || continue
    d=${d%/}
    printf 'release:%s %s\n' "$(stat -c %Y -- "$d/.hosttune/release.json" 2>/dev/null || stat -c %Y -- "$d")" "$d"
done
# The wheel sets uploaded (a folder per wheel, named by its sha256[:16]) and the wheels each complete release's
# release.json names: the sets no release kept names go with the old releases.
for d in "$root"/wheels/*/; do
    [ -d "$d" ] && printf 'wheelset:%s\n' "${d%/}"
done
for d in "$root"/releases/*/; do
    d=${d%/}
    [ -f "$d/.hosttune/release.json" ] || continue
    printf 'uses:%s %s\n' "$d" "$(grep -o '"sha256": *"[0-9a-f]*"' -- "$d/.hosttune/release.json" | sed 's/.*"\([0-9a-f]*\)"$/\1/' | tr '\n' ' ')"
done
for p in "$@"; do
    [ -f "$p" ] && printf 'wheel:%s %s\n' "$(sha256sum < "$p" | cut -d' ' -f1)" "$p"
done
for u in hosttune-ray.service hosttune-serve.service hosttune-engine@.service hosttune-probe.service hosttune-probe.timer hosttune-router.service; do
    f=/etc/systemd/system/$u
    [ -f "$f" ] || continue
    printf 'unit:%s %s %s\n' "$u" "$(sha256sum < "$f" | cut -d' ' -f1)" "$(systemctl is-active "$u" 2>/dev/null)"
done
# The replicas: instances of the templated unit systemd knows (loaded, running or failed).
systemctl list-units --all --plain --no-legend 'hosttune-engine@*.service' 2>/dev/null | while read -r u load active rest; do
    printf 'instance:%s %s\n' "$u" "$active"
done
# A host `hosttune remediate` cordoned: deploy refuses it until `hosttune uncordon`.
[ -f /var/lib/hosttune/cordon.json ] && printf 'cordon:%s\n' "$(tr -d '\n' < /var/lib/hosttune/cordon.json)"
printf 'nginx:%s\n' "$(command -v nginx || ls /usr/sbin/nginx 2>/dev/null)"
# The ports this deployment's nginx listens on (hosttune-local.conf): nginx there is ours, and lets go of a port
# the new release's config does not name when it reloads at the switch.
conf=/etc/nginx/conf.d/hosttune-local.conf
[ -f "$conf" ] && sed -n 's/^[[:space:]]*listen[[:space:]][[:space:]]*\([^;[:space:]]*\).*/\1/p' "$conf" | sed 's/.*://; s/^/nginx-listen:/'
exit 0
