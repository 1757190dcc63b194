"""Async one-shot probes of nodes (used by the CLI to check many nodes concurrently)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.membership import MembersReply, MembersRequest
from shardex.api.node import StatusReply, StatusRequest
from shardex.errors import ShardexError
from shardex.net import TcpTransport, Transport
from shardex.net import connect as rpc_connect


@dataclasses.dataclass
class ProbeResult:
    address: str
    status: StatusReply | None = None  # set iff the node answered an authenticated status
    members: MembersReply | None = None
    error: ShardexError | None = None

    @property
    def up(self) -> bool:
        return self.status is not None


async def probe(
    address: str,
    secret: str,
    *,
    timeout: float = 2.0,
    transport: Transport | None = None,
    name: str = "shardex-cli",
) -> ProbeResult:
    """Connect (authenticated), ask status and membership view, close. Never raises a
    ``ShardexError``: failures are reported in the result."""
    result = ProbeResult(address)
    transport = transport or TcpTransport()
    try:
        conn = await rpc_connect(transport, address, secret, name=name, timeout=timeout)
    except ShardexError as e:
        result.error = e
        return result
    try:
        result.status = await conn.request(StatusRequest(), timeout, expect=StatusReply)
        result.members = await conn.request(MembersRequest(), timeout, expect=MembersReply)
    except ShardexError as e:
        result.error = e
    finally:
        await conn.close()
    return result


async def probe_all(
    addresses: Sequence[str],
    secret: str,
    *,
    timeout: float = 2.0,
    transport: Transport | None = None,
) -> list[ProbeResult]:
    transport = transport or TcpTransport()
    return list(
        await asyncio.gather(
            *(probe(a, secret, timeout=timeout, transport=transport) for a in addresses)
        )
    )


async def committed_voters(
    address: str,
    secret: str,
    *,
    timeout: float = 2.0,
    name: str = "shardex-cli",
    transport: Transport | None = None,
) -> set[str] | None:
    """The coordinator's committed voters as the manager at ``address`` reads them from the
    master (None: no answer, no master yet, or nothing committed yet)."""
    transport = transport or TcpTransport()
    try:
        conn = await rpc_connect(transport, address, secret, name=name, timeout=timeout)
    except ShardexError:
        return None
    try:
        reply = await conn.request(
            StateRequest(sections=["voters"], fresh=True), timeout, expect=StateReply
        )
    except ShardexError:
        return None
    finally:
        await conn.close()
    return set(reply.state.voters) or None
