"""What identity costs: a user's login (the client's Argon2id derivation, then the whole
handshake over loopback TCP, against a node secret's) and the check a user's connection runs
on every message (``net/gate.py``), in process.

    python -m bench.diagnostics.auth_cost
"""

from __future__ import annotations

import asyncio
import statistics
import time
import timeit
from types import SimpleNamespace

from shardex.api.data import Get
from shardex.api.privileges import authorize
from shardex.meta.state import StateContext
from shardex.meta.users import new_record
from shardex.net import RpcServer, TcpTransport, connect
from shardex.net.auth import _user_keys
from shardex.net.credentials import Argon2Params, Principal, UserCredential, UserLogin
from shardex.net.gate import UserGate
from shardex.node.users import StateUsers

SECRET = "auth-cost-node-secret-0123456789"
LOGINS = 20
CHECKS = 200_000


class _Users:
    def __init__(self, cred: UserCredential) -> None:
        self.cred = cred

    def lookup_user(self, name: str) -> UserCredential | None:
        return self.cred if name == self.cred.name else None


async def _connects(
    address: str, credentials: object, n: int = LOGINS, *, fresh: bool = False
) -> float:
    times = []
    for _ in range(n):
        if fresh:  # the client's first login with this password: Argon2 included
            _user_keys.cache_clear()
        start = time.perf_counter()
        conn = await connect(TcpTransport(), address, credentials, name="bench")  # type: ignore[arg-type]
        times.append(time.perf_counter() - start)
        await conn.close()
    return statistics.median(times) * 1e3


async def _logins() -> tuple[float, float, float]:
    rec = new_record("bench", "pw", ("data_reader(*)",), Argon2Params())
    server = RpcServer(TcpTransport(), SECRET, name="n1", users=_Users(rec.credential()))
    address = await server.start("127.0.0.1:0")
    try:
        node = await _connects(address, SECRET)
        first = await _connects(address, UserLogin("bench", "pw"), LOGINS, fresh=True)
        again = await _connects(address, UserLogin("bench", "pw"))
        return node, first, again
    finally:
        await server.stop()


def main() -> None:
    node_ms, first_ms, again_ms = asyncio.run(_logins())
    rec = new_record("u", "pw", ("data_reader(ks)",), Argon2Params(1, 64, 1))
    coordinator = SimpleNamespace(state=StateContext(users={"u": rec}))  # what StateUsers reads
    gate = UserGate(authorize, StateUsers(lambda: coordinator))  # type: ignore[arg-type,return-value]
    principal = Principal("user", "u", ("data_reader(ks)",))
    msg = Get(keyspace="ks", docid="d")
    per_check = timeit.timeit(lambda: gate.check(principal, msg), number=CHECKS) / CHECKS
    print(f"connect, node secret  p50 {node_ms:7.2f} ms")
    print(f"connect, user, first  p50 {first_ms:7.2f} ms  (Argon2id t=2 m=19MiB p=1)")
    print(f"connect, user, again  p50 {again_ms:7.2f} ms  (keys derived once per process)")
    print(f"user message check        {per_check * 1e6:7.2f} us")


if __name__ == "__main__":
    main()
