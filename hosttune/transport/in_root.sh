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
