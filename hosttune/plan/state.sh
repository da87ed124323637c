# hosttune plan state: read-only. Reports the current state of what a plan would change.
# argv: ROOT MANAGER then requests KIND:VALUE (file:PATH unit:NAME kernel:PATH pkg:NAME held:).
# Prints "@@s:N" ... "@@s-end:N" around the answer to request N. Values arrive as argv only.
export LC_ALL=C
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
root=$1; manager=$2; shift 2

inroot() { if [ "$root" = / ]; then "$@"; else chroot "$root" "$@"; fi; }
sysd() { if [ "$root" = / ]; then systemctl "$@"; else systemctl --root="$root" "$@"; fi; }

# The file a path under the root names, through its links as the root resolves them (in_root, sent in front of this
# script): an absolute link in an image names a file of the image, not of this machine, and `..` stops at the root.
real() { if [ "$root" = / ]; then readlink -f -- "$1"; else in_root "$root" "${1#"${root%/}"}" all; fi; }

file() {
    p=$1
    [ "$root" = / ] || p=$(in_root "$root" "${1#"${root%/}"}") || exit 1
    if [ -L "$p" ]; then
        printf 'link:%s\n' "$(readlink -- "$p")"
        r=$(real "$1") || exit 1
        printf 'real:%s\n' "$r"
        [ "$root" = / ] || p=$r
    fi
    if [ -f "$p" ]; then
        stat -L -c 'stat:file %a %u %g' -- "$p"
        printf 'sha:%s\n' "$(sha256sum < "$p" | cut -d' ' -f1)"
        printf 'data:'; base64 -w0 < "$p"; printf '\n'
    elif [ -d "$p" ]; then printf 'stat:dir\n'
    elif [ -e "$p" ]; then printf 'stat:other\n'
    else printf 'stat:absent\n'
    fi
}

unit() {
    printf 'enabled:%s\n' "$(sysd is-enabled "$1" 2>/dev/null | head -n1)"
    if [ "$root" = / ]; then printf 'active:%s\n' "$(systemctl is-active "$1" 2>/dev/null)"; fi
}

kernel() { printf 'value:'; head -n1 -- "$1" 2>/dev/null || printf '\n'; }

pkg() {
    case $manager in
    apt)
        inroot dpkg-query -W -f='installed:${Version}\t${db:Status-Abbrev}\n' "$1" 2>/dev/null
        # Empty cache paths: apt-cache builds its cache in memory instead of writing /var/cache/apt (read-only).
        inroot apt-cache -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= madison "$1" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print "available:" $2}' ;;
    dnf)
        inroot rpm -q --qf 'installed:%{EPOCHNUM}:%{VERSION}-%{RELEASE}\tii\n' "$1" 2>/dev/null | grep '^installed:'
        inroot dnf list --showduplicates -q --available "$1" 2>/dev/null | awk 'NF == 3 && $1 ~ /\./ {print "available:" $2}' ;;
    esac
    return 0
}

held() {
    case $manager in
    apt) inroot apt-mark -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= showhold 2>/dev/null | sed 's/^/held:/' ;;
    dnf) grep -hs . "$(real "${root%/}/etc/dnf/plugins/versionlock.list")" | sed 's/^/lock:/' ;;
    esac
    return 0
}

n=0
for request in "$@"; do
    printf '@@s:%s\n' "$n"
    value=${request#*:}
    case $request in
        file:*) file "$value" ;;
        unit:*) unit "$value" ;;
        kernel:*) kernel "$value" ;;
        pkg:*) pkg "$value" ;;
        held:*) held ;;
    esac
    printf '@@s-end:%s\n' "$n"
    n=$((n + 1))
done
exit 0
