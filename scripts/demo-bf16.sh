#!/usr/bin/env bash
# The demo with its actors decoding in bf16 (routers fp32) against the fp32 learner: the main
# arm trains without routing replay, the ablation with R3 (`[rl] router_replay = "rollout"`) on
# a copy of the same SFT result, same seeds and budget. Both configs are configs/demo.toml
# with only those settings changed, written into runs/demo-bf16.configs/. Compare the arms'
# `mismatch` figures (metrics/metrics.jsonl) and held-out success (report.json: the arm `r3`
# is the stage `ablation-r3` in its `arms`).
#
#   scripts/demo-bf16.sh                         # SFT, then RL as the demo's budget allows
#   scripts/demo-bf16.sh DIR MINUTES             # RL from the SFT policy in DIR (e.g. a copy
#                                                # of runs/demo-bf16/ref), MINUTES per arm
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
corvid="$root/target/release/corvid"
from=${1:-}
rl_minutes=${2:-}
out=runs/demo-bf16.configs
if [ -n "$from" ]; then
  [ -f "$from/model.safetensors" ] || { echo "$from: no SFT policy (model.safetensors) there" >&2; exit 2; }
  case "$(realpath "$from")" in "$(realpath -m runs/demo-bf16)"*)
    echo "$from is inside runs/demo-bf16, which this script replaces; copy it elsewhere" >&2; exit 2;;
  esac
  [ -n "$rl_minutes" ] || { echo "give the RL minutes per arm after the policy folder" >&2; exit 2; }
fi
rm -rf runs/demo-bf16 runs/demo-bf16-ablation-r3 "$out"
mkdir -p "$out"
init=()
if [ -n "$from" ]; then
  init=(-e "s|^# init = .*|init = \"$(realpath "$from")\"|" -e 's/^sft = true .*/sft = false/')
fi
sed "${init[@]}" -e 's/^run_name = "demo" .*/run_name = "demo-bf16"/' \
    -e "s|^ablation = .*|ablation = { r3 = \"$out/demo-bf16-r3.toml\" }|" \
    -e 's/^\[run\].*/[run]\nactor_dtype = "bf16"/' \
    configs/demo.toml > "$out/demo-bf16.toml"
sed -e 's/^run_name = .*/run_name = "demo-bf16-r3"/' \
    -e 's/^ablation = .*/ablation = ""/' \
    -e 's/^router_replay = .*/router_replay = "rollout"/' \
    "$out/demo-bf16.toml" > "$out/demo-bf16-r3.toml"
grep -q '^router_replay = "rollout"' "$out/demo-bf16-r3.toml"
grep -q '^actor_dtype = "bf16"' "$out/demo-bf16.toml"
if [ -n "$rl_minutes" ]; then
  "$corvid" run --config "$out/demo-bf16.toml" --rl-minutes "$rl_minutes"
else
  "$corvid" run --config "$out/demo-bf16.toml"
fi
# `corvid run` trains the arm `r3` in a copy of the SFT run folder, runs/demo-bf16-ablation-r3.
for arm in demo-bf16 demo-bf16-ablation-r3; do
  echo "== $arm: mean mismatch over its updates that trained"
  python3 - "runs/$arm/metrics/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l)["mismatch"] for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("token_mult_prob_error", 0) >= 1]
keys = ["k3_kl", "token_mult_prob_error", "logp_abs_diff_mean", "ratio_above_2_frac", "routing_agreement", "routing_overlap"]
out = {"updates": len(rows), **{k: sum(r.get(k) or 0 for r in rows) / max(len(rows), 1) for k in keys}}
# k3 over the tokens of the learner's own version (lag 0), pooled over updates by token count.
lag0 = [(r["k3_kl_lag0"], r["lag0_tokens"]) for r in rows if r.get("k3_kl_lag0") is not None]
n = sum(t for _, t in lag0)
out["k3_kl_lag0"] = sum(k * t for k, t in lag0) / n if n else None
out["lag0_tokens"] = n
print(json.dumps(out))
PY
done
