# The cleanup of a conductor that could not clean up (SIGKILL, a crash): see watchdog.py.
# Usage: sh watchdog.sh TAG, stdin a pipe only the conductor holds, carrying lines
#   "+ PGID TICKS"  a component started in process group PGID, with TICKS tenths of grace
#   "- PGID"        that component was stopped: forget it
#   "d DIR"         a directory of the conductor's (the MCP bridge's socket) to remove
#   "k DIR"         the conductor removed it itself: forget it
# At EOF, TERM then KILL every group still listed, and (Linux) every process whose
# environment has ACP_CONDUCTOR_COMPONENT_<token>=TAG; then remove the directories listed.
tag=$1
groups=
dirs=
ticks=0
while read -r op pgid t; do
    case $op in
        +) groups="$groups $pgid"
           [ "$t" -gt "$ticks" ] 2>/dev/null && ticks=$t ;;
        -) kept=
           for g in $groups; do [ "$g" = "$pgid" ] || kept="$kept $g"; done
           groups=$kept ;;
        d) dirs="$dirs $pgid" ;;  # (a path of mkdtemp's: one word)
        k) kept=
           for d in $dirs; do [ "$d" = "$pgid" ] || kept="$kept $d"; done
           dirs=$kept ;;
    esac
done
remove_dirs() {
    for d in $dirs; do
        case $d in /*/acp-conductor-*) rm -rf -- "$d" ;; esac  # never anything else
    done
}
[ -n "$groups" ] || { remove_dirs; exit 0; }  # everything was stopped by the conductor

strays() {
    grep -lszE "^ACP_CONDUCTOR_COMPONENT_[^=]*=$tag\$" /proc/[0-9]*/environ 2>/dev/null |
        sed -e 's,^/proc/,,' -e 's,/environ$,,'
}
left() {
    for g in $groups; do kill -0 -- "-$g" 2>/dev/null && return 0; done
    [ -n "$(strays)" ]
}
for sig in TERM KILL; do
    for g in $groups; do kill -s "$sig" -- "-$g" 2>/dev/null; done
    for p in $(strays); do kill -s "$sig" "$p" 2>/dev/null; done
    n=0
    while [ "$n" -lt "$ticks" ] && left; do sleep 0.1; n=$((n + 1)); done
done
remove_dirs
