#!/usr/bin/env bash
# Compare the PTX of every kernel with a manifest written before a change to the generators
# (`ferrodnn ptx-manifest`): prints the kernels whose PTX changed, and a summary.
# Usage: scripts/ptx_diff.sh BASE.txt NEW.txt (a NEW written with --filter is compared on its own
# graphs: "only before" then counts the graphs it left out). SHOW=N prints N changed kernels.
set -euo pipefail
base=$1; new=$2
join -j1 <(awk '{print $1"|"$2"|"$3"|"$4, $5}' "$base" | sort) <(awk '{print $1"|"$2"|"$3"|"$4, $5}' "$new" | sort) > /tmp/ptx_join.txt
total=$(wc -l < /tmp/ptx_join.txt)
changed=$(awk '$2 != $3' /tmp/ptx_join.txt | wc -l)
only_base=$(join -v1 -j1 <(awk '{print $1"|"$2"|"$3"|"$4}' "$base" | sort) <(awk '{print $1"|"$2"|"$3"|"$4}' "$new" | sort) | wc -l)
only_new=$(join -v2 -j1 <(awk '{print $1"|"$2"|"$3"|"$4}' "$base" | sort) <(awk '{print $1"|"$2"|"$3"|"$4}' "$new" | sort) | wc -l)
awk '$2 != $3' /tmp/ptx_join.txt | head -${SHOW:-20}
echo "kernels in both: $total; PTX changed: $changed; only before: $only_base; only after: $only_new"
