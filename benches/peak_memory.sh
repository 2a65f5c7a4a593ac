#!/usr/bin/env bash
# The example service's peak memory with the profiler's defaults and with heap and CPU sampling
# off, alternated: VmHWM at exit, and the highest RssAnon and RssFile seen polling
# /proc/PID/status every 5 ms (the poll misses the briefest peaks; VmHWM does not).
#   cargo build --release --example service && benches/peak_memory.sh [rounds]
set -euo pipefail
bin="$(cd "$(dirname "$0")/.." && pwd)/target/release/examples/service"
rounds="${1:-3}"

peak() {
    local label=$1 dir pid hwm=0 anon=0 file=0 a f h
    shift
    dir=$(mktemp -d)
    (cd "$dir" && exec env "$@" SERVICE_REQUESTS=20000 "$bin" >/dev/null 2>&1) &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        read -r a f h < <(awk '/^RssAnon/{a=$2} /^RssFile/{f=$2} /^VmHWM/{h=$2} END{print a+0, f+0, h+0}' \
            "/proc/$pid/status" 2>/dev/null || echo "0 0 0")
        ((a > anon)) && anon=$a
        ((f > file)) && file=$f
        ((h > hwm)) && hwm=$h
        sleep 0.005
    done
    echo "$label VmHWM=$((hwm / 1024))MiB RssAnon_peak=$((anon / 1024))MiB RssFile_peak=$((file / 1024))MiB"
    rm -rf "$dir"
}

for _ in $(seq "$rounds"); do
    peak "defaults    "
    peak "sampling off" TRACING_PROF_SAMPLE_RATE=0 TRACING_PROF_CPU_HZ=0
done
