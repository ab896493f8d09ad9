#!/usr/bin/env bash
# Fuzz the policy parser, the shell splitter and the action reader for a few
# minutes each. Not run in CI. Needs a nightly toolchain and cargo-fuzz
# (`cargo +nightly install cargo-fuzz`). Findings land in fuzz/artifacts/.
#
#   policy/fuzz/run.sh            # 120 s per target
#   SECONDS_PER_TARGET=600 policy/fuzz/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${SECONDS_PER_TARGET:-120}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../target-fuzz}"
for t in policy_parse shell_split action_json; do
  echo "== $t ($secs s)"
  mkdir -p "fuzz/corpus/$t.work"
  cargo +nightly fuzz run "$t" "fuzz/corpus/$t.work" "fuzz/corpus/$t" -- \
    -max_total_time="$secs" -max_len=4096 -rss_limit_mb=1024 2>&1 | tail -n 5
done
echo "artifacts (crashes), if any:"
ls -1 fuzz/artifacts/*/ 2>/dev/null || echo "  none"
