#!/usr/bin/env bash
# Fleet ingest: 64 actor streams from two other network hosts into one learner.
#
# Makes four network namespaces: a "switch" holding a bridge, a learner host (10.77.0.1) and
# two actor hosts (10.77.0.2, 10.77.0.3), each host joined to the bridge by a veth pair (MTU
# 1500, optionally `tc netem` delay on every host's interface). Runs
# `corvid bench fleet serve` on the learner host and `corvid bench fleet send` with
# --streams-per-host streams (one connection each) on each actor host, then, for the
# baseline in the same run and build, `corvid bench ingest` (one stream over loopback, same
# tokens per step) --baseline-runs times, taking the median. Prints one JSON line: both
# rates, their ratio, the learner process's peak RSS growth, and the nothing-lost check
# (acked on the senders == stored, no failures, no duplicates, the senders' id digests sum
# to the store's). Everything it made (namespaces, links, processes, the temporary store)
# is removed on exit, also on failure.
#
# Needs root (network namespaces), ip, jq (and tc with --delay-ms), and the release binary:
#   cargo build --release -p corvid --bin corvid
#
# Usage: sudo scripts/bench_fleet.sh [--trajectories K] [--tokens T] [--tokens-per-step S]
#          [--streams-per-host N] [--delay-ms D] [--baseline-runs R] [--out FILE]
#          [--bin PATH] [--deadline-s SECS]
# Example: sudo scripts/bench_fleet.sh --out docs/bench/raw/fleet.jsonl
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$REPO/target/release/corvid"
STREAMS_PER_HOST=32
TRAJECTORIES=480    # per stream
TOKENS=16000        # per trajectory: 16 turns of 1,000 tokens
TOKENS_PER_STEP=1000
DELAY_MS=0
BASELINE_RUNS=3
DEADLINE_S=900
OUT=""
TOKEN="fleet-bench"

die() {
    echo "bench_fleet.sh: $*" >&2
    exit 2
}

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

need_value() {
    [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"
}

is_count() {
    [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] || die "$1 $2: expected a whole number ≥ 1"
}

while [ $# -gt 0 ]; do
    case "$1" in
    --trajectories) need_value "$@"; is_count "$1" "$2"; TRAJECTORIES=$2; shift 2 ;;
    --tokens) need_value "$@"; is_count "$1" "$2"; TOKENS=$2; shift 2 ;;
    --tokens-per-step) need_value "$@"; is_count "$1" "$2"; TOKENS_PER_STEP=$2; shift 2 ;;
    --streams-per-host) need_value "$@"; is_count "$1" "$2"; STREAMS_PER_HOST=$2; shift 2 ;;
    --baseline-runs) need_value "$@"; is_count "$1" "$2"; BASELINE_RUNS=$2; shift 2 ;;
    --deadline-s) need_value "$@"; is_count "$1" "$2"; DEADLINE_S=$2; shift 2 ;;
    --delay-ms)
        need_value "$@"
        [[ "$2" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--delay-ms $2: expected a number of milliseconds"
        DELAY_MS=$2
        shift 2
        ;;
    --out) need_value "$@"; OUT=$2; shift 2 ;;
    --bin) need_value "$@"; BIN=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
done

[ "$(id -u)" -eq 0 ] || die "needs root to create network namespaces; run it as root (sudo $0 ...)"
for tool in ip jq; do
    command -v "$tool" >/dev/null || die "needs $tool on PATH"
done
if [ "$DELAY_MS" != 0 ]; then
    command -v tc >/dev/null || die "--delay-ms needs tc (iproute2) on PATH"
fi
[ -x "$BIN" ] || die "no binary at $BIN; build it: cargo build --release -p corvid --bin corvid"
[ $((TOKENS % TOKENS_PER_STEP)) -eq 0 ] ||
    die "--tokens $TOKENS is not a multiple of --tokens-per-step $TOKENS_PER_STEP"

TAG="cvf$$"
NS_SW="$TAG-sw"
NS_L="$TAG-l"
NS_A1="$TAG-a1"
NS_A2="$TAG-a2"
LEARNER_ADDR=10.77.0.1
PORT=50051
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench_fleet.XXXXXX")
MADE_NS=()
MADE_LINKS=()
PIDS=()

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local pid
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        wait "$pid" 2>/dev/null || true
    done
    local l ns
    # A link still in this namespace (a failure between creating and moving it).
    for l in ${MADE_LINKS[@]+"${MADE_LINKS[@]}"}; do
        ip link del "$l" 2>/dev/null || true
    done
    # Deleting a namespace deletes the links in it (and their peers).
    for ns in ${MADE_NS[@]+"${MADE_NS[@]}"}; do
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ the network
ip netns add "$NS_SW"
MADE_NS+=("$NS_SW")
ip -n "$NS_SW" link set lo up
ip -n "$NS_SW" link add br0 type bridge
ip -n "$NS_SW" link set br0 up

# add_host NAME NAMESPACE ADDRESS: a host joined to the switch's bridge.
add_host() {
    local name=$1 ns=$2 addr=$3
    local host_end="${TAG}h$name" switch_end="${TAG}s$name"
    ip netns add "$ns"
    MADE_NS+=("$ns")
    MADE_LINKS+=("$host_end" "$switch_end")
    ip link add "$host_end" type veth peer name "$switch_end"
    ip link set "$host_end" netns "$ns"
    ip link set "$switch_end" netns "$NS_SW"
    ip -n "$ns" link set "$host_end" name eth0
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip -n "$NS_SW" link set "$switch_end" master br0
    ip -n "$NS_SW" link set "$switch_end" up
    if [ "$DELAY_MS" != 0 ]; then
        ip netns exec "$ns" tc qdisc add dev eth0 root netem delay "${DELAY_MS}ms" ||
            die "--delay-ms: tc cannot add a netem qdisc here (is sch_netem in this kernel?)"
    fi
}
add_host l "$NS_L" "$LEARNER_ADDR"
add_host a1 "$NS_A1" 10.77.0.2
add_host a2 "$NS_A2" 10.77.0.3

# ------------------------------------------------------------------ the fleet
STREAMS=$((2 * STREAMS_PER_HOST))
EXPECT=$((STREAMS * TRAJECTORIES))
echo "bench_fleet.sh: $STREAMS streams ($STREAMS_PER_HOST on each of 2 actor hosts) x" \
    "$TRAJECTORIES trajectories of $TOKENS tokens ($((TOKENS / TOKENS_PER_STEP)) steps of" \
    "$TOKENS_PER_STEP) = $EXPECT trajectories, $((EXPECT * TOKENS)) tokens; netem delay" \
    "${DELAY_MS} ms per host" >&2

ip netns exec "$NS_L" "$BIN" bench fleet serve --store "$WORK/store" \
    --listen "$LEARNER_ADDR:$PORT" --token "$TOKEN" --expect "$EXPECT" \
    --deadline-s "$DEADLINE_S" --json >"$WORK/serve.json" 2>"$WORK/serve.log" &
SERVER_PID=$!
PIDS+=("$SERVER_PID")
for _ in $(seq 600); do
    grep -q "listening on" "$WORK/serve.log" && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/serve.log" >&2; die "the server did not start"; }
    sleep 0.1
done
grep -q "listening on" "$WORK/serve.log" || die "the server did not listen within 60 s"

SENDER_PIDS=()
for host in a1 a2; do
    ns="$TAG-$host"
    ip netns exec "$ns" timeout --signal=TERM "$((DEADLINE_S + 60))" \
        "$BIN" bench fleet send --learner "http://$LEARNER_ADDR:$PORT" --token "$TOKEN" \
        --name "$host" --streams "$STREAMS_PER_HOST" --trajectories "$TRAJECTORIES" \
        --tokens "$TOKENS" --tokens-per-step "$TOKENS_PER_STEP" --json \
        >"$WORK/send-$host.json" 2>"$WORK/send-$host.log" &
    SENDER_PIDS+=($!)
    PIDS+=($!)
done
status=0
for pid in "${SENDER_PIDS[@]}"; do
    wait "$pid" || status=$?
done
wait "$SERVER_PID" || status=$?
for f in send-a1 send-a2 serve; do
    if ! jq -e . "$WORK/$f.json" >/dev/null 2>&1; then
        echo "--- $f.log" >&2
        tail -n 20 "$WORK/$f.log" >&2 || true
        die "$f printed no JSON (exit status $status)"
    fi
done
[ "$status" -eq 0 ] || echo "bench_fleet.sh: a fleet process exited with status $status" >&2

# ------------------------------------------------------------------ the baseline
: >"$WORK/baseline.jsonl"
for _ in $(seq "$BASELINE_RUNS"); do
    TMPDIR="$WORK" "$BIN" bench ingest --tokens 1000000 --tokens-per-step "$TOKENS_PER_STEP" \
        --json >>"$WORK/baseline.jsonl" 2>>"$WORK/baseline.log" ||
        { cat "$WORK/baseline.log" >&2; die "corvid bench ingest failed"; }
done

# ------------------------------------------------------------------ the record
D1=$(jq -r .ids_digest "$WORK/send-a1.json")
D2=$(jq -r .ids_digest "$WORK/send-a2.json")
DS=$(jq -r .ids_digest "$WORK/serve.json")
[[ "$D1$D2$DS" =~ ^[0-9a-f]{48}$ ]] || die "unexpected digests: $D1 $D2 $DS"
# Bash arithmetic wraps at 64 bits, as the digest does.
DIGEST_SUM=$(printf '%016x' $((0x$D1 + 0x$D2)))
COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$REPO" diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT+dirty"
CPU=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')

LINE=$(jq -n -c \
    --slurpfile serve "$WORK/serve.json" \
    --slurpfile a1 "$WORK/send-a1.json" \
    --slurpfile a2 "$WORK/send-a2.json" \
    --slurpfile base "$WORK/baseline.jsonl" \
    --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --arg commit "$COMMIT" \
    --arg machine "$(nproc) cores, $CPU" \
    --arg digest_sum "$DIGEST_SUM" \
    --argjson delay_ms "$DELAY_MS" \
    --argjson streams_per_host "$STREAMS_PER_HOST" \
    --argjson exit_status "$status" '
    $serve[0] as $s | [$a1[0], $a2[0]] as $senders
    | ($base | map(.tokens_per_s) | sort) as $b
    | $b[(($b | length) - 1) / 2 | floor] as $base_rate
    | ($senders | map(.acked) | add) as $acked
    | ($senders | map(.failed) | add) as $failed
    | ($senders | map(.duplicates) | add) as $dups
    | ($digest_sum == $s.ids_digest) as $digest_match
    | ($acked == $s.trajectories_stored and $failed == 0 and $dups == 0 and $digest_match
        and $s.open_left == 0 and ($s.sample_mismatches | length) == 0) as $nothing_lost
    | ($s.tokens_per_s / $base_rate) as $ratio
    | {
        date: $date, commit: $commit, machine: $machine,
        hosts: 2, streams: ($streams_per_host * 2),
        trajectories_per_stream: $a1[0].trajectories_per_stream,
        tokens_per_trajectory: $a1[0].tokens_per_trajectory,
        tokens_per_step: $a1[0].tokens_per_step,
        netem_delay_ms: $delay_ms,
        trajectories_stored: $s.trajectories_stored, tokens_stored: $s.tokens_stored,
        fleet_seconds: $s.seconds,
        fleet_trajectories_per_s: $s.trajectories_per_s,
        fleet_tokens_per_s: $s.tokens_per_s,
        baseline_tokens_per_s: $base_rate,
        baseline_runs_tokens_per_s: ($base | map(.tokens_per_s)),
        ratio_vs_single_stream: $ratio,
        peak_rss_growth_mb: $s.peak_rss_growth_mb,
        acked: $acked, duplicates: $dups, failed: $failed,
        digest_match: $digest_match, nothing_lost: $nothing_lost,
        cursor_skipped: $s.cursor_skipped,
        learner_cpu_s: $s.cpu_s,
        senders_cpu_s: ($senders | map(.cpu_s) | add),
        submit_ms_p50: ($senders | map(.submit_ms_p50)),
        submit_ms_p99: ($senders | map(.submit_ms_p99)),
        goals: {
          ratio_ge_0_5: ($ratio >= 0.5),
          rss_growth_le_256_mb: ($s.peak_rss_growth_mb <= 256),
          nothing_lost: $nothing_lost
        },
        exit_status: $exit_status,
        server: $s, senders: $senders, baseline: $base
      }')
echo "$LINE"
if [ -n "$OUT" ]; then
    mkdir -p "$(dirname "$OUT")"
    echo "$LINE" >>"$OUT"
fi
echo "$LINE" | jq -r '"bench_fleet.sh: \(.trajectories_stored) trajectories, \(.tokens_stored) tokens in \(.fleet_seconds * 100 | round / 100) s: \(.fleet_tokens_per_s / 1e6 * 100 | round / 100)M tokens/s (\(.fleet_trajectories_per_s | round) trajectories/s) vs \(.baseline_tokens_per_s / 1e6 * 100 | round / 100)M single-stream loopback: ratio \(.ratio_vs_single_stream * 100 | round / 100); peak RSS +\(.peak_rss_growth_mb | round) MB; nothing lost: \(.nothing_lost) (acked \(.acked), failed \(.failed), digest match \(.digest_match)); cursor skipped \(.cursor_skipped)"' >&2
echo "$LINE" | jq -e '.nothing_lost and .exit_status == 0' >/dev/null
