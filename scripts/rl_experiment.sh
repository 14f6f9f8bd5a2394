#!/usr/bin/env bash
# RL-only experiments from the demo's SFT policy, as in
# docs/bench/raw/experiments-2026-12-01-s10.md: the demo config with some lines changed, RL for
# its [run] budget, no ablation, held-out evaluation from hops level 3 up to the frontier
# reached (200 episodes per level).
#
#   scripts/rl_experiment.sh NAME ['sed expression applied to configs/demo.toml' ...]
#   scripts/rl_experiment.sh lr5 's/^lr = 3e-5 /lr = 5e-5 /'
#   CONFIG=runs/s15c.toml BASE=runs/sftb8c768 scripts/rl_experiment.sh kl0 's/^kl_coef = 0.05 /kl_coef = 0.0 /'
#
# CONFIG (default configs/demo.toml) is the config edited; BASE (default runs/sft-base) the
# finished SFT run whose policy (BASE/ref) RL starts from, through `[model] init` with
# `[schedule] sft = false`. A BASE that does not exist yet is trained first, from CONFIG.
# The first call trains the demo's SFT once into runs/sft-base (~11 minutes on 2 cores) and
# every later call starts from a copy of it. Prints the evaluation lines; the run is in
# runs/NAME (metrics/metrics.jsonl, store/, report.json). Run one at a time: the RL budget is
# wall-clock, so anything else computing changes the result.
set -euo pipefail
cd "$(dirname "$0")/.."

name=${1:?usage: scripts/rl_experiment.sh NAME [sed-expression ...]}
shift
corvid=target/release/corvid
base=${BASE:-runs/sft-base}  # BASE=runs/OTHER starts from another finished SFT run
config_in=${CONFIG:-configs/demo.toml}  # CONFIG=FILE edits another config
[ -x "$corvid" ] || cargo build --release -p corvid
[ -e "runs/$name" ] && { echo "runs/$name exists; choose another NAME or remove it" >&2; exit 1; }

if [ ! -f "$base/ref/config.json" ]; then
  echo "training the SFT of $config_in into $base (once)" >&2
  mkdir -p "$base"
  sed -e 's/^run_name = .*/run_name = "sft-base"/' -e 's/^prometheus = .*/prometheus = ""/' \
    "$config_in" > "$base.toml"
  "$corvid" learner --config "$base.toml" --run-dir "$base" > "$base.log" 2>&1 &
  pid=$!
  until grep -q "sft finished" "$base.log"; do
    kill -0 "$pid" 2>/dev/null || { echo "the SFT learner exited; see $base.log" >&2; exit 1; }
    sleep 5
  done
  kill -TERM "$pid"
  wait "$pid" || true
fi

args=(-e 's/^eval_levels = .*/eval_levels = "3..3"/' -e 's/^prometheus = .*/prometheus = ""/'
  -e 's/^sft = true /sft = false /' -e "s|^\\[model\\]\$|[model]\\ninit = \"$base/ref\"|")
for e in "$@"; do args+=(-e "$e"); done
config="runs/$name.toml"
sed "${args[@]}" "$config_in" > "$config"
grep -q "^init = \"$base/ref\"" "$config" || { echo "$config: no [model] table to set init in" >&2; exit 1; }
# RL for a fixed RL_MINUTES (default 2.75, as the experiments in docs/bench/raw used), not
# what the config's run_minutes would leave after a skipped SFT.
"$corvid" run --config "$config" --name "$name" --no-ablation --rl-minutes "${RL_MINUTES:-2.75}" \
  > "runs/$name.log" 2>&1
grep -E "hops/[0-9]" "runs/$name.log"
