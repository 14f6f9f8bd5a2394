#!/usr/bin/env bash
# The main job: train a tiny MoE policy to use tools, end to end, on this machine's CPU.
# `corvid run` starts a learner and actor processes on loopback, runs SFT on oracle
# demonstrations, then RL with the curriculum (and the trajectory-level GRPO ablation on a
# copy of the SFT result), evaluates the random, SFT and RL policies on held-out seeds and
# writes runs/demo/report.html and report.json. Budgets are in configs/demo.toml ([run]).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
corvid="$root/target/release/corvid"
# The demo owns these folders; a previous demo's are replaced.
rm -rf runs/demo runs/demo-ablation-grpo
# `corvid run` sets OMP_WAIT_POLICY per process (ACTIVE for SFT alone, PASSIVE while the
# learner and actors share the cores; see BENCHMARKS.md, Model) unless it is set here.
start=$(date +%s)
"$corvid" run --config configs/demo.toml
end=$(date +%s)
echo
echo "== the run took $(( (end - start) / 60 )) min $(( (end - start) % 60 )) s"
echo "== report: $root/runs/demo/report.html (numbers in runs/demo/report.json)"
"$corvid" replay stats --store runs/demo/store | head -n 20
