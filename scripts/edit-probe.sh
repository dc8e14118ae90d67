#!/bin/bash
# Incremental build time after a real edit of FILE: a private function is appended, then
# `cargo build` and `cargo test --workspace --no-run` are timed, each after a fresh edit; the
# file is restored and the target left warm. Run on a warm target with nothing else running
# (docs/benchmarks.md, "The crate split").
set -u
f=$1
backup=$(mktemp)
cp "$f" "$backup"
trap 'cp "$backup" "$f"; rm -f "$backup"' EXIT
for what in "build" "test --workspace --no-run"; do
  printf '\n#[allow(dead_code)]\nfn edit_probe() -> u64 { %s }\n' "$RANDOM" >> "$f"
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  cargo $what -q >/dev/null 2>&1
  rc=$?
  end=$(date +%s.%N)
  printf '%s | %s | %.1f s (exit %s)\n' "$f" "$what" "$(echo "$end - $start" | bc)" "$rc"
  cp "$backup" "$f"
done
cargo build -q >/dev/null 2>&1
cargo test --workspace --no-run -q >/dev/null 2>&1
