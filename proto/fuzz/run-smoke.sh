#!/usr/bin/env bash
# Bounded smoke run of every cargo-fuzz target of quicdemux-proto.
# Exits non-zero as soon as a target crashes (libFuzzer then leaves the input under
# artifacts/<target>/). Usage: proto/fuzz/run-smoke.sh [seconds-per-target]
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a nightly compiler, or a stable
# one with RUSTC_BOOTSTRAP=1 (set below unless a nightly toolchain is selected).
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-15}"
if ! rustc --version | grep -q nightly; then
    export RUSTC_BOOTSTRAP=1
fi
targets=(header route wire_frame wire_registration wire_data wire_admin keyfile peer_frame retry_mint owner_initial quic_lb_decode)
cargo fuzz build
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "== fuzz $t: up to ${secs}s / 2 000 000 runs"
    # -runs bounds fast targets, -max_total_time bounds slow ones.
    if ! cargo fuzz run "$t" -- -max_total_time="$secs" -runs=2000000 -print_final_stats=1 2>"target/$t.log"; then
        tail -n 40 "target/$t.log"
        echo "FAIL: fuzz target $t crashed (see proto/fuzz/artifacts/$t/)" >&2
        exit 1
    fi
    grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "target/$t.log" || true
done
echo "fuzz smoke: all ${#targets[@]} targets ran clean"
