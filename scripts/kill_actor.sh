#!/usr/bin/env bash
# How soon a SIGKILLed actor's episodes go to another actor (docs/bench/log.md, 2026-12-03 "an actor's episodes go to another actor 3 s after a SIGKILL";
# the current figure: BENCHMARKS.md, "End to end").
# A learner on the end-to-end tests' tiny run (tests/e2e.toml, 12 updates) and two actors of
# 4 episodes on loopback; actor 0 is SIGKILLed after its second acknowledged trajectory.
# Prints the kill time, the learner's "actor went silent" line (with the episodes it handed
# out again) and how long the learner took to finish after the kill.
#
#   scripts/kill_actor.sh [ACTOR_TIMEOUT_S]     (default 3; 600 shows the behaviour without)
#
# Needs `make release`. Work folder: /tmp/corvid-kill-actor (replaced on every call).
set -euo pipefail
cd "$(dirname "$0")/.."

timeout_s="${1:-3}"
bin=target/release/corvid
dir=/tmp/corvid-kill-actor
[[ -x "$bin" ]] || { echo "no $bin: run make release first" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir"
sed -e "s/^actor_timeout_s = .*/actor_timeout_s = $timeout_s/" \
    -e "s/^max_updates = .*/max_updates = 12/" tests/e2e.toml >"$dir/run.toml"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

"$bin" learner --config "$dir/run.toml" --run-dir "$dir/run" --listen "127.0.0.1:$port" \
    >"$dir/learner.log" 2>&1 &
learner=$!
actors=()
trap 'kill -9 "${actors[@]}" "$learner" 2>/dev/null || true' EXIT
until [[ -f "$dir/run/token" ]]; do sleep 0.2; done
for i in 0 1; do
    RUST_LOG=info,corvid_actor::submit=debug "$bin" actor --learner "http://127.0.0.1:$port" \
        --token-file "$dir/run/token" --concurrency 4 --spool "$dir/spool-$i" \
        >"$dir/actor-$i.log" 2>&1 &
    actors+=($!)
    disown  # no "Killed" job notice from bash
done
until [[ $(grep -c acked "$dir/actor-0.log") -ge 2 ]]; do sleep 0.1; done
killed=$(date +%s.%N)
kill -9 "${actors[0]}"
echo "actor 0 SIGKILLed at $(date -u +%H:%M:%S.%N) UTC"
wait "$learner"
done_at=$(date +%s.%N)
grep "went silent" "$dir/learner.log" || echo "(no actor went silent: actor_timeout_s = $timeout_s)"
echo "expired groups: $(grep -c 'group expired' "$dir/learner.log" || true)"
echo "the learner finished $(python3 -c "print(round($done_at - $killed, 1))") s after the kill"
