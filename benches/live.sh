#!/usr/bin/env bash
# What a `tracing-prof live` client costs the service: the example's wall time for its requests
# serving /debug/pprof with no client, with a client asking /debug/pprof/live?seconds=1 back to
# back (what `live` does), and with one asking /debug/pprof/heap every second, alternated. Also
# each live answer's size and the time it took past its 1 s window.
#   cargo build --release --example service && benches/live.sh [rounds] [requests]
set -euo pipefail
bin="$(cd "$(dirname "$0")/.." && pwd)/target/release/examples/service"
rounds="${1:-5}"
requests="${2:-100000}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"

run() {
    local label=$1 client=$2 pid url cpid=""
    TRACING_PROF_HTTP_ADDR=127.0.0.1:0 SERVICE_REQUESTS=$requests "$bin" >out.txt 2>&1 &
    pid=$!
    until url=$(grep -o 'http://[0-9.:]*/debug/pprof' out.txt 2>/dev/null); do sleep 0.01; done
    case $client in
        live) (while curl -sf -o /dev/null -w '%{size_download} %{time_total}\n' \
                   "$url/live?seconds=1" >>live.txt; do :; done) & cpid=$! ;;
        heap) (while curl -sf -o /dev/null "$url/heap"; do sleep 1; done) & cpid=$! ;;
    esac
    wait "$pid"
    [[ -n $cpid ]] && { kill "$cpid" 2>/dev/null || true; wait "$cpid" 2>/dev/null || true; }
    echo "$label $(grep -o 'requests in [0-9.]* s' out.txt)"
}

for _ in $(seq "$rounds"); do
    run "no client    " none
    run "live client  " live
    run "heap every 1s" heap
done
echo "live answers (bytes, seconds incl. the 1 s window):"
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)], "(max", v[NR] ")"}'; }
echo "n $(wc -l <live.txt), median bytes $(cut -d' ' -f1 live.txt | median), median seconds $(cut -d' ' -f2 live.txt | median)"
