#!/usr/bin/env bash
# The main job: a real local cluster on loopback. Each issue extends it; today it starts a
# 3-node cluster and its index pipeline (Spark), loads a generated data set, builds two
# secondary indexes through Spark, watches their stability timestamp cover an update, runs
# request_plus scans while a writer writes (every acknowledged write visible), adds a node
# and rebalances data and index partitions while paginated scans run (rows read == rows
# expected), runs SQL++ queries with their EXPLAIN and an UPDATE, kills a data node under
# majority-durable writers (automatic failover, recovery, rebalance: no acknowledged write
# lost), prints the web console's URL, the metrics URLs and a curl example against the
# N1QL query service (run once to show its answer), and stops the cluster.
# The Python steps are modules under src/shardex/demo/ (each runnable with python -m).
# SHARDEX_DEMO_DOCS sets the data set size (default 50000: a few minutes on 2 cores);
# SHARDEX_DEMO_PAGE the page size of the paginated scans (default 100).
# --keep (make demo KEEP=1, or SHARDEX_DEMO_KEEP=1): leave the cluster running at the end,
# to look at it in the console; stop it with: .venv/bin/shardex cluster stop --dir demo-cluster
set -euo pipefail
cd "$(dirname "$0")/.."
KEEP=${SHARDEX_DEMO_KEEP:-}
for arg in "$@"; do
    case "$arg" in
        --keep) KEEP=1 ;;
        *) echo "usage: scripts/demo.sh [--keep]" >&2; exit 2 ;;
    esac
done
export SPARK_LOCAL_IP=127.0.0.1
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
DIR=${SHARDEX_DEMO_DIR:-demo-cluster}
NODES=${SHARDEX_DEMO_NODES:-3}
DOCS=${SHARDEX_DEMO_DOCS:-50000}
PAGE=${SHARDEX_DEMO_PAGE:-100}
SX=.venv/bin/shardex
PY=.venv/bin/python

step() { printf '\n\033[1;34m==> %s\033[0m\n' "$*"; }

# A previous run that was interrupted may have left nodes behind: stop them first. A previous
# run also added a node to cluster.json, so start from an empty directory (only one that holds
# a cluster.json: never remove anything else).
if [ -f "$DIR/cluster.json" ]; then
    "$SX" cluster stop --dir "$DIR" >/dev/null 2>&1 || true
    rm -rf "$DIR"
fi
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

step "Creating keyspace users (64 partitions over the data nodes, 2 replica copies of each)"
# A re-run reuses the cluster directory: start the keyspace afresh so the counts add up.
"$SX" keyspace drop users --dir "$DIR" >/dev/null 2>&1 || true
# Two replicas: with three copies a majority (two) survives the loss of any node, so
# majority-durable writes go on through the failover step below.
"$SX" keyspace create users --partitions 64 --replicas 2 --dir "$DIR"

step "Generating $DOCS users (deterministic, seed 42) as JSON Lines"
"$PY" -m shardex.demo.datagen "$DIR/users.jsonl" --docs "$DOCS" --seed 42
head -c 400 "$DIR/users.jsonl"; echo " ..."

step "Bulk-loading them: shardex load users $DIR/users.jsonl --id-field id"
"$SX" load users "$DIR/users.jsonl" --dir "$DIR" --id-field id

step "Documents per node and per partition"
"$SX" keyspace stats users --dir "$DIR"

step "Creating two secondary indexes; the pipeline's Spark job builds them from a snapshot"
"$SX" ddl --dir "$DIR" 'CREATE INDEX by_city ON users(address.city, age) PARTITION BY HASH(META().id) WITH {"num_partition": 4}'
"$SX" ddl --dir "$DIR" "CREATE INDEX by_status ON users(status, age DESC) WHERE age >= 18"
"$SX" index wait users by_city --dir "$DIR" --timeout 900
"$SX" index wait users by_status --dir "$DIR" --timeout 900
"$SX" index list users --dir "$DIR"

step "Reading, updating with CAS and streaming through the Python client"
.venv/bin/python - "$DIR" <<'PY'
import sys
from shardex.client import Change, connect_local
from shardex.errors import ShardexError

with connect_local(sys.argv[1]) as client:
    users = client.keyspace("users")
    for docid in ("user-0000000", "user-0000042", "user-0000999"):
        v = users.get_versioned(docid)
        d = v.doc
        print(f"{docid} (partition {users.partition_of(docid)}, seqno {v.seqno}): {d['name']}, "
              f"{d['age']}, {d['address']['city']} {d['address']['country']}, {d['status']}, "
              f"tags {d['tags']}")
    v = users.get_versioned("user-0000042")
    r = users.replace("user-0000042", {**v.doc, "status": "vip"}, cas=v.cas)
    print(f"replace with CAS -> partition {r.partition}, seqno {r.seqno}")
    try:
        users.replace("user-0000042", {**v.doc, "status": "lost update"}, cas=v.cas)
    except ShardexError as e:
        print(f"replace with the old CAS -> {e.code.value}: {e.message}")
    try:
        users.get("no-such-user")
    except ShardexError as e:
        print(f"get of a missing document -> {e.code.value}")
    ts = client.high_seqnos("users")
    print(f"high seqnos: {len(ts)} partitions, {sum(e.seqno for e in ts.values()):,} mutations")
    with users.stream(r.partition, from_seqno=max(0, r.seqno - 3)) as stream:
        for item in stream:
            if isinstance(item, Change):
                print(f"  change stream of partition {r.partition}: seqno {item.seqno} "
                      f"{item.op} {item.docid}")
PY

step "The indexes follow the writes: time until their stability TS covers an update"
.venv/bin/python - "$DIR" <<'PY'
import sys
import time
from shardex.client import connect_local

with connect_local(sys.argv[1]) as client:
    users = client.keyspace("users")
    for i in range(5):
        v = users.get_versioned(f"user-000010{i}")
        t0 = time.monotonic()
        r = users.replace(f"user-000010{i}", {**v.doc, "status": "vip", "age": 40}, cas=v.cas)
        while True:
            ix = {x["name"]: x for x in client.list_indexes("users")}
            st = [ix[n]["stability_ts"] or {} for n in ("by_city", "by_status")]
            if all(s.get(r.partition, 0) >= r.seqno for s in st):
                break
            time.sleep(0.005)
        print(f"update of user-000010{i} (partition {r.partition}, seqno {r.seqno}) covered "
              f"by both indexes' stability TS after {(time.monotonic() - t0) * 1000:.0f} ms")
    for n in ("by_city", "by_status"):
        print(f"{n}: {ix[n]['items_count']:,} entries, state {ix[n]['state']}")
PY

step "Writing while scanning: request_plus scans see every acknowledged write"
"$PY" -m shardex.demo.scans "$DIR" --docs "$DOCS"

step "Adding node $((NODES + 1)): shardex cluster add-node (it holds nothing until a rebalance)"
"$SX" cluster add-node --dir "$DIR"

step "shardex rebalance (data and index partitions) while paginated scans run"
"$PY" -m shardex.demo.elastic "$DIR" --index by_city --page-size "$PAGE"
# the per-node table only (awk reads to the end: no SIGPIPE under pipefail)
"$SX" keyspace stats users --dir "$DIR" | awk '!done { print } /^└/ { done = 1 }'
COLUMNS=140 "$SX" index list users --dir "$DIR"  # wide enough for the placement

step "SQL++ across the cluster at request_plus, each query with its EXPLAIN"
"$PY" -m shardex.demo.sql "$DIR"

step "An UPDATE through shardex sql, and a query that shows its effect"
Q='SELECT plan, COUNT(*) AS users FROM users WHERE address.city = "Reykjavik" GROUP BY plan ORDER BY plan'
echo "shardex sql: $Q"
"$SX" sql --dir "$DIR" "$Q"
U='UPDATE users SET plan = "pro", upgraded = true WHERE address.city = "Reykjavik" AND age < 40'
echo "shardex sql: $U"
"$SX" sql --dir "$DIR" "$U"
echo "shardex sql: $Q"
"$SX" sql --dir "$DIR" "$Q"

step "kill -9 of a data node under majority-durable writes: automatic failover, recovery, rebalance"
"$PY" -m shardex.demo.failover "$DIR"
echo "shardex sql (request_plus, through the index, after the failover): $Q"
"$SX" sql --dir "$DIR" "$Q"

step "The cluster over HTTP: web console, Prometheus metrics, N1QL query service"
"$PY" -m shardex.demo.http_endpoints "$DIR"

if [ -n "$KEEP" ]; then
    trap - EXIT
    step "The cluster keeps running (--keep)"
    echo "stop it with: $SX cluster stop --dir $DIR"
    exit 0
fi
step "Stopping the cluster (make demo KEEP=1 leaves it running)"
"$SX" cluster stop --dir "$DIR"
trap - EXIT
