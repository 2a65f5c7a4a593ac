#!/usr/bin/env bash
# What a compile-time feature of tracing-prof-core (default: `opentelemetry`, trace links) costs
# span enter+exit and a span's life, for a layer that links nothing: the span_enter_exit bench
# built without and with the feature, one process each, alternated for [pairs] pairs. Each
# process gives its median over 31 alternating rounds of the default layer's time added over the
# registry with a no-op layer; the script prints every pair's two added times and, at the end,
# the median of the per-pair differences (with the feature minus without).
#   benches/feature_cost.sh [pairs] [feature]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
pairs="${1:-21}"
feature="${2:-opentelemetry}"
cd "$root"

build() { # target dir, cargo args...: the bench executable's path
    local dir=$1
    shift
    CARGO_TARGET_DIR="$dir" cargo bench -p tracing-prof-core --bench span_enter_exit --no-run \
        --message-format=json "$@" 2>/dev/null |
        grep -o '"executable":"[^"]*span_enter_exit[^"]*"' | tail -1 | cut -d'"' -f4
}
without=$(build "$root/target")
with=$(build "$root/target/feature-$feature" --features "$feature")

added() { # executable: "enter_exit lifecycle", each the layer's median minus the registry's
    "$1" span/default_only | awk -F'|' '
        /^\| registry /          { base = $3 + 0 }
        /^\| \+ layer \(default\)/ { printf "%.2f ", $3 - base }'
}

printf '%-5s %-28s %-28s\n' pair "without: enter+exit life" "with: enter+exit life"
: >"$root/target/feature_cost.txt"
for i in $(seq "$pairs"); do
    read -r a_ee a_life <<<"$(added "$without")"
    read -r b_ee b_life <<<"$(added "$with")"
    printf '%-5s %-28s %-28s\n' "$i" "$a_ee $a_life" "$b_ee $b_life"
    echo "$a_ee $a_life $b_ee $b_life" >>"$root/target/feature_cost.txt"
done
sort_median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "median added without the feature: enter+exit $(awk '{ print $1 }' "$root/target/feature_cost.txt" | sort_median) ns," \
    "a span's life $(awk '{ print $2 }' "$root/target/feature_cost.txt" | sort_median) ns"
echo "median added with it:             enter+exit $(awk '{ print $3 }' "$root/target/feature_cost.txt" | sort_median) ns," \
    "a span's life $(awk '{ print $4 }' "$root/target/feature_cost.txt" | sort_median) ns"
echo "median of per-pair differences:   enter+exit $(awk '{ print $3 - $1 }' "$root/target/feature_cost.txt" | sort_median) ns," \
    "a span's life $(awk '{ print $4 - $2 }' "$root/target/feature_cost.txt" | sort_median) ns"
