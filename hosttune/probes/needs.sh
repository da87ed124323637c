# hosttune preconditions: read-only. What a plan's operations need on the host, as it is now.
# argv: ROOT MANAGER then requests KIND:VALUE (cmd:NAME mcmd:NAME venv:PYTHON dir:PATH space:PATH
# port:NUMBER pkg:NAME). Prints "@@n:N" ... "@@n-end:N" around the answer to request N.
# Values arrive as argv only; nothing here writes anything.
export LC_ALL=C
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
root=$1; manager=$2; shift 2
# inside PATH: where the root's PATH lies here, through its links as the root resolves them (in_root, sent in front
# of this script), so every test below is of the root's own file.
inside() { if [ "$root" = / ]; then printf '%s' "$1"; else in_root "$root" "$1" all; fi; }
# A command run inside the root, as apply runs the image's own programs (plan/state.sh does the same).
inroot() { if [ "$root" = / ]; then "$@"; else chroot "$root" "$@"; fi; }

# A program inside the root: the directories chroot's PATH searches.
cmd() {
    for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
        if [ -x "$(inside "$d/$1")" ] && [ ! -d "$(inside "$d/$1")" ]; then printf 'found:%s\n' "$d/$1"; return 0; fi
    done
    return 0
}

mcmd() { p=$(command -v -- "$1" 2>/dev/null) && printf 'found:%s\n' "$p"; return 0; }

# Whether the program NAME (or /PATH) is there: on the host's PATH, or in the root where chroot's PATH finds it.
has() {
    if [ "$root" = / ]; then command -v -- "$1" >/dev/null 2>&1; return; fi
    case $1 in /*) [ -x "$(inside "$1")" ] && [ ! -d "$(inside "$1")" ] ;; *) [ -n "$(cmd "$1")" ] ;; esac
}

# Whether PYTHON (the root's, under --root) makes virtualenvs.
venv() {
    has "$1" || { printf 'missing:\n'; return 0; }
    if err=$(inroot "$1" -c 'import ensurepip, venv' 2>&1); then printf 'ok:\n'
    else printf 'fail:%s\n' "$(printf '%s' "$err" | tail -n1)"; fi
}

# What stands where `mkdir -p` must make the directory PATH: its nearest existing path, when that is not a
# directory (a file, a dangling link), as the root sees it.
blocker() {
    p=$(inside "$1") || exit 1
    while [ ! -e "$p" ] && [ ! -L "$p" ]; do p=$(dirname -- "$p"); done
    [ -d "$p" ] || printf 'blocked:%s\n' "${p#"${root%/}"}"
}

dir() {
    p=$(inside "$1") || exit 1
    if [ -d "$p" ]; then printf 'kind:dir\n'; elif [ -e "$p" ] || [ -L "$p" ]; then printf 'kind:other\n'
    else printf 'kind:absent\n'; blocker "$(dirname -- "$1")"; fi
}

# The filesystem that will hold PATH: that of its nearest existing directory; and what is in the way of its directory.
space() {
    p=$(inside "$1") || exit 1
    while [ ! -d "$p" ]; do p=$(dirname -- "$p"); done
    df -Pk -- "$p" 2>/dev/null | awk 'NR == 2 {print "free-kb:" $4 " " $6}'
    blocker "$(dirname -- "$1")"
}

# Who listens on a TCP port: one "listen:UNIT" line per listening process (UNIT "?" when unknown).
port() {
    command -v ss >/dev/null 2>&1 || { printf 'unknown:no ss on the host\n'; return 0; }
    ss -Hltnp 2>/dev/null | awk -v p=":$1" 'substr($4, length($4) - length(p) + 1) == p' | while IFS= read -r line; do
        pids=$(printf '%s' "$line" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u)
        [ -n "$pids" ] || { printf 'listen:?\n'; continue; }
        for pid in $pids; do
            unit=$(grep -o '[^/]*\.service' "/proc/$pid/cgroup" 2>/dev/null | tail -n1)
            printf 'listen:%s\n' "${unit:-?}"
        done
    done
    return 0
}

# The version of NAME the root's own package manager would install (the root's lists, through chroot).
pkg() {
    case $manager in
    apt) inroot apt-cache -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= policy -- "$1" 2>/dev/null |
            awk '$1 == "Candidate:" && $2 != "(none)" {print "candidate:" $2}' ;;
    dnf) inroot dnf list -q --available -- "$1" 2>/dev/null | awk 'NF == 3 && $1 ~ /\./ {print "candidate:" $2; exit}' ;;
    esac
    return 0
}

n=0
for request in "$@"; do
    printf '@@n:%s\n' "$n"
    value=${request#*:}
    case $request in
        cmd:*) cmd "$value" ;;
        mcmd:*) mcmd "$value" ;;
        venv:*) venv "$value" ;;
        dir:*) dir "$value" ;;
        space:*) space "$value" ;;
        port:*) port "$value" ;;
        pkg:*) pkg "$value" ;;
    esac
    printf '@@n-end:%s\n' "$n"
    n=$((n + 1))
done
exit 0
