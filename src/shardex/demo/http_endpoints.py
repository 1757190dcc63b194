"""The demo's last step: where the running cluster answers over HTTP. Prints the web
console's URL, each node's metrics URL and a curl example against the N1QL query service,
then runs that very statement over HTTP to show its answer (so the lines printed are known
to work while the cluster is up).

    python -m shardex.demo.http_endpoints DIR [--statement SQL]
"""

from __future__ import annotations

import argparse
import base64
import json
import shlex
import ssl
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from shardex.meta import cluster_dir as cdir
from shardex.pipeline.process import pipeline_metrics_url

__all__ = ["endpoints", "main"]

# the demo's own query (through its by_city index)
DEFAULT_STATEMENT = (
    'SELECT plan, COUNT(*) AS users FROM users WHERE address.city = "Reykjavik" '
    "GROUP BY plan ORDER BY plan"
)


def endpoints(cluster: Path, statement: str) -> dict[str, Any]:
    """The console, metrics and query service URLs of the cluster in ``cluster`` and the
    curl command of ``statement`` (HTTPS when the cluster runs TLS)."""
    spec = cdir.load(cluster)
    scheme = "https" if spec.tls_dir else "http"
    urls = [f"{scheme}://{n.address.rsplit(':', 1)[0]}:{n.http_port}" for n in spec.nodes]
    password_file = cluster / (spec.admin_password_file or cdir.ADMIN_PASSWORD_FILE)
    ca = cdir.tls_ca(cluster, spec)
    curl = [
        "curl",
        "-s",
        *(["--cacert", str(ca)] if ca is not None else []),
        "-u",
        f'"admin:$(cat {shlex.quote(str(password_file))})"',
        f"{urls[0]}/query/service",
        "--data-urlencode",
        f"statement={statement}",
    ]
    return {
        "console": f"{urls[0]}/ui/",
        "metrics": [f"{u}/metrics" for u in urls],
        "pipeline_metrics": pipeline_metrics_url(cluster),
        "query": f"{urls[0]}/query/service",
        "password_file": str(password_file),
        "ca": str(ca) if ca is not None else None,
        # the password stays in its file: $(cat ...) is for the shell to expand
        "curl": " ".join(a if a.startswith('"admin:$(') else shlex.quote(a) for a in curl),
    }


def _run(where: dict[str, Any], statement: str) -> dict[str, Any]:
    password = Path(where["password_file"]).read_text().strip()
    token = base64.b64encode(f"admin:{password}".encode()).decode()
    req = urllib.request.Request(
        where["query"],
        data=urllib.parse.urlencode({"statement": statement}).encode(),
        headers={"Authorization": f"Basic {token}"},
    )
    context = ssl.create_default_context(cafile=where["ca"]) if where["ca"] else None
    with urllib.request.urlopen(req, timeout=60, context=context) as resp:
        return json.loads(resp.read())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cluster", type=Path)
    ap.add_argument("--statement", default=DEFAULT_STATEMENT)
    args = ap.parse_args(argv)
    where = endpoints(args.cluster, args.statement)
    print(f"Web console:   {where['console']}")
    print(f"               log in as admin, password in {where['password_file']}")
    print(f"Metrics:       {where['metrics'][0]}   (Prometheus text, one per node:")
    for url in where["metrics"][1:]:
        print(f"               {url}")
    print("               scrape with the admin user or a cluster_admin)")
    if where["pipeline_metrics"]:
        print(f"Pipeline:      {where['pipeline_metrics']}   (its batches and builds, no login)")
    print(f"Query service: {where['curl']}")
    answer = _run(where, args.statement)
    print(f"  -> status {answer['status']}, {answer['metrics']['resultCount']} rows:")
    for row in answer.get("results", []):
        print(f"     {json.dumps(row)}")
    for err in answer.get("errors", []):
        print(f"     error {err.get('code')}: {err.get('msg')}")
    return 0 if answer["status"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
