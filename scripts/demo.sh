#!/usr/bin/env bash
# The main job: a real local cluster on loopback. Each issue extends it; today it starts a
# 3-node cluster, shows its status, talks to it through the Python client and stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
export SPARK_LOCAL_IP=127.0.0.1
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
DIR=${SHARDEX_DEMO_DIR:-demo-cluster}
NODES=${SHARDEX_DEMO_NODES:-3}
SX=.venv/bin/shardex

step() { printf '\n\033[1;34m==> %s\033[0m\n' "$*"; }

# A previous run that was interrupted may have left nodes behind: stop them first.
if [ -f "$DIR/cluster.json" ]; then "$SX" cluster stop --dir "$DIR" >/dev/null 2>&1 || true; fi
trap '"$SX" cluster stop --dir "$DIR" >/dev/null 2>&1 || true' EXIT

step "Starting a $NODES-node cluster on 127.0.0.1 in $DIR"
"$SX" cluster start --nodes "$NODES" --dir "$DIR"

step "Cluster status"
"$SX" cluster status --dir "$DIR"

step "Connecting with the Python client (shardex.client.connect_local)"
.venv/bin/python - "$DIR" <<'PY'
import sys
from shardex.client import connect_local

with connect_local(sys.argv[1]) as client:
    node = client.ping()
    view = client.cluster_status()
    print(f"connected to {node.name} ({node.address}) in {node.rtt * 1000:.1f} ms")
    print(f"membership seen by {view.observer} (version {view.version}):")
    for m in view.members:
        print(f"  {m.name:8} {m.address:16} {m.state}")
PY

step "Stopping the cluster"
"$SX" cluster stop --dir "$DIR"
trap - EXIT
