#!/usr/bin/env bash
# The demo with its actors decoding in bf16 (routers fp32) against the fp32 learner: the main
# arm trains without routing replay, the ablation with R3 (`[rl] router_replay = "rollout"`) on
# a copy of the same SFT result, same seeds and budget. Both configs are configs/demo.toml
# with only those settings changed, written into runs/demo-bf16.configs/. Compare the arms'
# `mismatch` figures (metrics/metrics.jsonl) and held-out success (report.json, where the
# ablation arm is listed as `ablation_grpo` whatever the ablation changes).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
corvid="$root/target/release/corvid"
out=runs/demo-bf16.configs
rm -rf runs/demo-bf16 runs/demo-bf16-ablation "$out"
mkdir -p "$out"
sed -e 's/^run_name = "demo" .*/run_name = "demo-bf16"/' \
    -e "s|^ablation = .*|ablation = \"$out/demo-bf16-r3.toml\"|" \
    -e 's/^\[run\].*/[run]\nactor_dtype = "bf16"/' \
    configs/demo.toml > "$out/demo-bf16.toml"
sed -e 's/^run_name = .*/run_name = "demo-bf16-r3"/' \
    -e 's/^ablation = .*/ablation = ""/' \
    -e 's/^\[rl\].*/[rl]\nrouter_replay = "rollout"/' \
    "$out/demo-bf16.toml" > "$out/demo-bf16-r3.toml"
grep -q '^router_replay = "rollout"' "$out/demo-bf16-r3.toml"
grep -q '^actor_dtype = "bf16"' "$out/demo-bf16.toml"
"$corvid" run --config "$out/demo-bf16.toml"
# `corvid run` trains the ablation in a copy of the SFT run folder, runs/demo-bf16-ablation.
for arm in demo-bf16 demo-bf16-ablation; do
  echo "== $arm: mean mismatch over its updates that trained"
  python3 - "runs/$arm/metrics/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l)["mismatch"] for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("token_mult_prob_error", 0) >= 1]
keys = ["k3_kl", "token_mult_prob_error", "logp_abs_diff_mean", "ratio_above_2_frac", "routing_agreement", "routing_overlap"]
print(json.dumps({"updates": len(rows), **{k: sum(r.get(k) or 0 for r in rows) / max(len(rows), 1) for k in keys}}))
PY
done
