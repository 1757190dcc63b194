"""Failover and recovery of data nodes from the client: ``failover``, ``recover``,
``failed_over``.

A part of ``Client`` kept apart for module size; it reaches the cluster only through the
client's ``RpcSession`` (``self.rpc``). Both ops carry a request id and go through
``RpcSession.ddl``: an attempt whose outcome is unknown is sent again, and the coordinator
answers a repeated id with the reply it stored, so a retried failover never runs twice.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.errors import BadRequest
from shardex.api.failover import RECOVERY_KINDS, FailedOver, Failover, Recover, Recovered

if TYPE_CHECKING:
    from shardex.client.rpc_session import RpcSession


class FailoverOps:
    """Failover and recovery: a base of ``Client``, which provides ``rpc``."""

    rpc: RpcSession

    def failover(self, node: str, *, allow_data_loss: bool = False) -> FailedOver:
        """Fail data node ``node`` over: for each partition it held active, its replica with
        the highest seqno becomes active; the node serves nothing until ``recover``.
        ``.promoted``: keyspace -> partition -> new active node; ``.lost``: keyspace ->
        partitions left on the failed node, unavailable (only with ``allow_data_loss``;
        without it such a failover is refused, BAD_REQUEST with ``details["lost"]``)."""
        msg = Failover(node=node, request_id=uuid.uuid4().hex, allow_data_loss=allow_data_loss)
        reply = self.rpc.run(self.rpc.ddl(msg, FailedOver))
        self.rpc.run(self.rpc.router.refresh())  # new actives: route to them at once
        return reply

    def recover(self, node: str, kind: str = "delta") -> Recovered:
        """Take failed-over ``node`` back (it must be up): ``kind`` "delta" keeps its copies
        and rolls them back to where the cluster branched, "full" drops them. It then holds
        nothing until a rebalance places partitions and replicas on it."""
        if kind not in RECOVERY_KINDS:
            raise BadRequest(
                f"unknown recovery kind {kind!r}",
                details={"kind": kind, "hint": f"one of {', '.join(RECOVERY_KINDS)}"},
            )
        msg = Recover(node=node, kind=kind, request_id=uuid.uuid4().hex)
        return self.rpc.run(self.rpc.ddl(msg, Recovered))

    def failed_over(self) -> dict[str, int]:
        """Failed-over nodes not yet recovered -> the state cas that failed each over."""
        msg = StateRequest(sections=["failed_over"], fresh=True)
        reply = self.rpc.call(msg, StateReply)
        return dict(reply.state.failed_over)
