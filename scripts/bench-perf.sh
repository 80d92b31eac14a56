# shellcheck shell=bash
# Sourced by scripts/bench, bench-cache and bench-intercept: one way to profile a process for the
# length of a row and write its report.
#
#   perf_start PID DATA SECONDS LOG   `perf record` of PID into DATA (…/perf-NAME.data) for
#                                     SECONDS, in the background; its pid in PERF_PID
#   perf_finish DATA                  waits for it, then writes DATA's report beside it:
#                                     perf-NAME-self.txt (by function, self time above 0.7%)
#                                     and perf-NAME-children.txt (inclusive, above 3%)

perf_start() {
    mkdir -p "$(dirname "$2")"
    perf record -q -e cpu-clock -F 1999 -g -p "$1" -o "$2" -- sleep "$3" 2>>"$4" &
    PERF_PID=$!
}

perf_finish() {
    local prefix=${1%.data}
    wait "$PERF_PID" || true
    perf report -i "$1" --stdio --no-children --sort symbol --percent-limit 0.7 2>/dev/null \
        | grep -E '^ +[0-9]' >"$prefix-self.txt" || true
    perf report -i "$1" --stdio --children --sort symbol --percent-limit 3 -g none 2>/dev/null \
        | grep -E '^ +[0-9]' >"$prefix-children.txt" || true
}
