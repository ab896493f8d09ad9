#!/bin/sh
# Changeset compute + apply of one changed file vs `cp -a`, on generated
# workspaces of 1k, 10k and 100k files. Prints a markdown table.
# Usage: snapshot/bench/apply.sh [SIZES...]   (run from the repo root)
set -eu
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target-snapshot}"
exec cargo run --quiet --release -p retie-snapshot --example bench -- "$@"
