# hosttune host operations: the only shell code that changes files on a host.
# Run as: sh -c "$SCRIPT" hosttune [-r ROOT] OP ARGS...  (every value arrives as argv, never as code)
# With -r ROOT (an image, apply --root), every path under ROOT is resolved inside it first (in_root, sent in front
# of this script): a link in the image, absolute or through `..`, never takes a change onto this machine's files.
set -u
umask 022
root=
if [ "$1" = -r ]; then root=${2%/}; shift 2; fi
op=$1; shift
# a folder that is no image (not there, an empty mount point) is refused before anything is read or written in it
[ -z "$root" ] || is_os_root "$root" || exit 1

die() { echo "hosttune: $*" >&2; exit 1; }
# at PATH [all]: where PATH lands, its directories (with all, its last name too) resolved inside the image when it
# lies under ROOT.
at() {
    case $1 in
        "$root"/*) [ -n "$root" ] && { in_root "$root" "${1#"$root"}" ${2:-} || exit 1; return; } ;;
    esac
    printf '%s\n' "$1"
}
sha() { sha256sum < "$1" | cut -d' ' -f1; }
current_sha() {
    if [ -L "$1" ]; then echo "link:$(readlink -- "$1")"
    elif [ -f "$1" ]; then sha "$1"
    elif [ -e "$1" ]; then echo other
    else echo absent; fi
}
exists() { [ -e "$1" ] || [ -L "$1" ]; }
# A fresh temporary name in the same directory as $1 (so the final rename is atomic).
tmp_beside() { mktemp -- "$(dirname -- "$1")/.hosttune-tmp.XXXXXX"; }

# mkdir -p, printing "created:DIR" for each directory it had to make (rollback removes them again).
made_dirs() {
    missing="" d=$1
    while ! exists "$d"; do missing="$d
$missing"; d=$(dirname -- "$d"); done
    printf '%s' "$missing" | while IFS= read -r d; do
        [ -n "$d" ] || continue
        mkdir -- "$d" || exit 1
        printf 'created:%s\n' "$d"
    done
}

# Copy $1 (file or link, with mode, owner and times) to $2, once: a retried write keeps the first backup.
backup() {
    [ -n "$2" ] && exists "$1" || return 0
    exists "$2" && return 0
    mkdir -p -- "$(dirname -- "$2")" || return 1
    cp -a -- "$1" "$2.part" && mv -fT -- "$2.part" "$2"
}

# write PATH MODE SHA256 BACKUP EXPECTED: stdin becomes PATH, or PATH is left as it was.
write() {
    p=$1 mode=$2 want=$3 bk=$4 expected=$5
    if [ -n "$expected" ] && [ "$(current_sha "$p")" != "$expected" ]; then
        die "$p changed since the plan was made; run hosttune apply again"
    fi
    made_dirs "$(dirname -- "$p")" || exit 1
    backup "$p" "$bk" || die "cannot back up $p to $bk"
    t=$(tmp_beside "$p") || exit 1
    trap 'rm -f -- "$t"' EXIT
    trap 'exit 1' HUP INT TERM PIPE
    cat > "$t" || die "$p: cannot write $t"
    [ "$(sha "$t")" = "$want" ] || die "$p: the new content did not arrive whole (connection lost?); $p is unchanged"
    if [ -f "$p" ]; then
        chown --reference="$p" -- "$t" && chmod --reference="$p" -- "$t" || exit 1
    else
        chmod -- "$mode" "$t" || exit 1
    fi
    sync -- "$t" 2>/dev/null
    mv -fT -- "$t" "$p" || exit 1
    trap - EXIT
}

# restore PATH BACKUP [optional]: PATH becomes a byte-for-byte copy of BACKUP (mode, owner, times too).
# "optional": a missing backup means the write never started, so PATH is as it was.
restore() {
    if ! exists "$2"; then [ "${3:-}" = optional ] && return 0; die "backup $2 of $1 is missing"; fi
    t=$(tmp_beside "$1") && rm -f -- "$t" || exit 1
    cp -a -- "$2" "$t" && mv -fT -- "$t" "$1"
}

# keep PATH COPY: a copy of PATH as it is now (mode, owner, times too), once: a retried rollback keeps the first.
keep() {
    exists "$1" || return 0
    exists "$2" && return 0
    mkdir -p -- "$(dirname -- "$2")" || return 1
    cp -a -- "$1" "$2.part" && mv -fT -- "$2.part" "$2"
}

# rmdirs DIR...: directories hosttune created go away again, if they are empty; "kept:DIR" for each that is not.
rmdirs() { for d in "$@"; do rmdir -- "$d" 2>/dev/null || { [ -d "$d" ] && printf 'kept:%s\n' "$d"; }; done; return 0; }

# remove PATH: a file hosttune created goes away again.
remove() { [ -d "$1" ] && [ ! -L "$1" ] && die "$1 is a directory; not removing it"; rm -f -- "$1"; }

# link PATH TARGET BACKUP: PATH becomes a symbolic link to TARGET, replaced atomically.
link() {
    backup "$1" "$3" || die "cannot back up $1"
    t=$(tmp_beside "$1") && rm -f -- "$t" || exit 1
    ln -s -- "$2" "$t" && mv -fT -- "$t" "$1"
}

# move FROM TO: rename (a toolkit moved aside, or back); nothing to do when FROM is gone.
move() {
    exists "$1" || return 0
    exists "$2" && die "$2 is in the way"
    mkdir -p -- "$(dirname -- "$2")" && mv -T -- "$1" "$2"
}

# journals DIR: every run journal in DIR, each after a "@@journal:NAME" line. No DIR is no run yet; a DIR that
# cannot be read is an error, never "no runs" (and so is an image root that is none, refused above).
journals() {
    exists "$1" || return 0
    { [ -d "$1" ] && [ -r "$1" ] && [ -x "$1" ]; } || die "cannot read the journal folder $1 (ssh.become: true reads it as root)"
    for f in "$1"/*.json; do
        [ -f "$f" ] || continue
        printf '@@journal:%s\n' "${f##*/}"; cat -- "$f"; printf '\n'
    done
}

# runs-dir DIR: the journal folder, private to root.
runs_dir() { mkdir -p -- "$1" && chmod 700 -- "$1"; }

# sha PATH: the sha256 of the file PATH names (read-only); none, and a failure, when it is no file.
sha_of() { [ -f "$1" ] && sha "$1"; }

# The paths among an operation's arguments, resolved where they land (a link's target and the rest stay as given).
case $op in
    write) p=$(at "$1") && bk=$(at "$4") || exit 1; shift; set -- "$p" "$1" "$2" "$bk" "$4" ;;
    restore|keep|move) p=$(at "$1") && q=$(at "$2") || exit 1; shift 2; set -- "$p" "$q" "$@" ;;
    link) p=$(at "$1") && bk=$(at "$3") || exit 1; set -- "$p" "$2" "$bk" ;;
    remove) p=$(at "$1") || exit 1; set -- "$p" ;;
    # folders and reads: through a last link too, so a folder linked elsewhere in the image is that one
    mkdirs|runs-dir|journals|sha) p=$(at "$1" all) || exit 1; shift; set -- "$p" "$@" ;;
    rmdirs) for d in "$@"; do q=$(at "$d" all) || exit 1; set -- "$@" "$q"; shift; done ;;
esac

case $op in
    write) write "$@" ;;
    restore) restore "$@" ;;
    keep) keep "$@" ;;
    remove) remove "$@" ;;
    rmdirs) rmdirs "$@" ;;
    link) link "$@" ;;
    mkdirs) made_dirs "$1" ;;
    move) move "$@" ;;
    journals) journals "$@" ;;
    runs-dir) runs_dir "$@" ;;
    sha) sha_of "$1" ;;
    *) die "unknown host operation $op" ;;
esac
