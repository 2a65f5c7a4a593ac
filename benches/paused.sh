#!/usr/bin/env bash
# The example service's wall time for its requests with the profiler's defaults, paused from
# the start (TRACING_PROF_TOGGLE_SIGNAL=SIGUSR2, one SIGUSR2 once the handler is in place), and
# with heap and CPU sampling off, alternated:
#   cargo build --release --example service && benches/paused.sh [rounds]
set -euo pipefail
bin="$(cd "$(dirname "$0")/.." && pwd)/target/release/examples/service"
rounds="${1:-5}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"

run() {
    local label=$1 pause=$2 out pid
    shift 2
    env "$@" SERVICE_REQUESTS=20000 "$bin" >out.txt 2>&1 &
    pid=$!
    if [[ $pause == 1 ]]; then
        # SIGUSR2 is bit 12 of SigCgt once the profiler's handler is installed.
        until (( 0x$(awk '/^SigCgt/{print $2}' /proc/$pid/status 2>/dev/null || echo 0) & 0x800 )); do
            sleep 0.001
        done
        kill -USR2 "$pid"
    fi
    wait "$pid"
    echo "$label $(grep -o 'requests in [0-9.]* s' out.txt)"
}

for _ in $(seq "$rounds"); do
    run "defaults    " 0
    run "paused      " 1 TRACING_PROF_TOGGLE_SIGNAL=SIGUSR2
    run "sampling off" 0 TRACING_PROF_SAMPLE_RATE=0 TRACING_PROF_CPU_HZ=0
done
