#!/bin/sh
# Measured comparison of two model tiers on the demo task (docs/models.md).
# Usage: compare.sh [RETIE] — runs each script against a fresh copy of the
# demo project, in a throw-away state directory, and prints one row per
# tier: turns, tool calls, tokens in/out (the script provider's estimate:
# characters / 4), and weighted units = tier x (in + out) / 1000.
# Against a real provider, replace `--provider script --script F` with
# `--provider P --model M` (one model per tier) and keep the rest.
set -eu
RETIE=${1:-retie}
HERE=$(cd "$(dirname "$0")" && pwd)
PROJ="$HERE/../project"
printf '| tier | stand-in | turns | tool calls | tokens in | tokens out | weighted units |\n'
printf '|---:|---|---:|---:|---:|---:|---:|\n'
for t in 1 3; do
  tmp=$(mktemp -d)
  mkdir -p "$tmp/ws" "$tmp/home"
  cp "$PROJ"/* "$tmp/ws/"
  out=$(HOME="$tmp/home" XDG_STATE_HOME="$tmp/home/state" XDG_CONFIG_HOME="$tmp/home/config" \
    "$RETIE" run "$tmp/ws" -p "Fix the failing tests of this project." \
    --provider script --script "$HERE/tier$t.json" --autonomy auto --json 2>/dev/null)
  printf "%s" "$out" | python3 -c "
import json,sys
r=json.load(sys.stdin); t=$t
ti,to=r['tokens_in'],r['tokens_out']
assert r['status']=='finished', r
print('| %d | tier%d.json | %d | %d | %d | %d | %.2f |' % (t,t,r['turns'],len(r['actions']),ti,to,t*(ti+to)/1000))"
  rm -rf "$tmp"
done
