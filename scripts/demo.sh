#!/usr/bin/env bash
# The main job of this build: ingest a million-token trajectory over loopback gRPC
# into a run's store, then replay it. (`corvid run`, which trains an agent end to
# end, replaces this when it lands.)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
corvid="$root/target/release/corvid"
run="$root/runs/demo-ingest"
rm -rf "$run"
mkdir -p "$run"

echo "== streaming a 1,000,000-token trajectory over gRPC into $run/store"
"$corvid" bench ingest --tokens 1000000 --keep "$run/store"
echo
echo "== corvid replay list --store $run/store"
"$corvid" replay list --store "$run/store"
echo
echo "== corvid replay stats --store $run/store"
"$corvid" replay stats --store "$run/store"
echo
echo "== corvid replay show (first 5 turns)"
"$corvid" replay show --store "$run/store" bench | head -n 14
echo
echo "store: $run/store"
