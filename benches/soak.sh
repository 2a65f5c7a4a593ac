#!/usr/bin/env bash
# The example service serving requests for MINUTES (default 60) at nice 19; once a minute, the
# `(tracing-prof)` path's in-use bytes from the latest span_memory file and the process's
# VmRSS / VmHWM in KiB (the example leaks on purpose, so RSS grows regardless):
#   cargo build --release --example service && cargo build --release -p tracing-prof-cli && benches/soak.sh [minutes]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
minutes="${1:-60}"
dir=$(mktemp -d)
cd "$dir"
SERVICE_DURATION_SECS=$((minutes * 60)) nice -n 19 "$root/target/release/examples/service" >service.out 2>&1 &
pid=$!
echo "minute | (tracing-prof) in use | VmRSS VmHWM"
for m in $(seq 1 "$minutes"); do
    sleep 60
    kill -0 "$pid" 2>/dev/null || break
    inuse=$("$root/target/release/tracing-prof" top --by span -t inuse_space profiles/span_memory.latest.pb.gz |
        awk '/\(tracing-prof\)/{print $1, $2; exit}')
    echo "$m | $inuse | $(awk '/^VmRSS/{r=$2} /^VmHWM/{h=$2} END{print r, h}' /proc/$pid/status)"
done
wait "$pid"
rm -rf "$dir"
