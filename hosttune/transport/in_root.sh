# in_root ROOT PATH [all]: where PATH of the image mounted at ROOT lies on this machine, resolved as the image
# resolves it (chroot semantics): a link's absolute target is the image's path, and `..` never climbs above ROOT.
# The last name is kept as it is (a write or a link replaces it), or followed too with `all`. Past 40 links
# it prints the path that loops to stderr and fails. Sent in front of the scripts that reach an image's files.
in_root() {
    ir_r=${1%/} ir_rest=${2#/} ir_cur= ir_hops=0
    while [ -n "$ir_rest" ]; do
        ir_c=${ir_rest%%/*}
        case $ir_rest in */*) ir_rest=${ir_rest#*/} ;; *) ir_rest= ;; esac
        case $ir_c in ''|.) continue ;; ..) ir_cur=${ir_cur%/*}; continue ;; esac
        if [ -L "$ir_r$ir_cur/$ir_c" ] && { [ -n "$ir_rest" ] || [ -n "${3:-}" ]; }; then
            ir_hops=$((ir_hops + 1))
            [ $ir_hops -le 40 ] || { echo "--root $1: $2 goes through more than 40 links inside the image" >&2; return 1; }
            ir_t=$(readlink -- "$ir_r$ir_cur/$ir_c")
            case $ir_t in /*) ir_cur= ;; esac
            ir_rest=${ir_t#/}${ir_rest:+/$ir_rest}
        else
            ir_cur=$ir_cur/$ir_c
        fi
    done
    printf '%s%s\n' "$ir_r" "${ir_cur:-/}"
}
# is_os_root ROOT: whether the folder ROOT holds an image's OS root, else one line on stderr saying what to give instead. Every
# OS root has /etc, and everything apply writes lives below it but /usr/local: a folder without it is an image that
# did not mount (an empty mount point), or the wrong folder. Apply's probe and every host operation under --root ask.
is_os_root() {
    ! [ -e "$1" ] || [ -d "$1/" ] || { echo "--root $1: is a file, not a folder; mount the image and give the folder it is mounted at" >&2; return 1; }
    [ -d "$1/" ] || { echo "--root $1: no such directory on this host; give the folder the image is mounted at" >&2; return 1; }
    # //, /. or /tmp/..: the running system, which an image's plan would change without its live values or boot loader
    ! [ "$1/" -ef / ] || { echo "--root $1: is this host's own root (/); leave --root out to change the running system, or give the folder an image is mounted at" >&2; return 1; }
    ir_etc=$(in_root "$1" /etc all) || return 1  # in_root has said which path loops
    [ -d "$ir_etc" ] || { echo "--root $1: does not look like an OS root (no etc folder); give the folder the image's root is mounted at" >&2; return 1; }
}
