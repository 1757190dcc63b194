"""The distributed SQL execution protocol (``../shared/seeds/sql-execution-protocol.md``).

Runs plan fragments on several members, independent of what they compute: query ids,
``execute`` to a fixed participant list, row batches (Arrow IPC) with byte-credit flow
control, cancel through the initiator (at most 2N messages), and ``check`` to free the state
of queries the initiator no longer runs. Mount it on a node with ``QueryService.install``.
"""

from shardex.api.query_ids import QueryId, QueryIdFactory
from shardex.api.sql_protocol import (
    FragmentSpec,
    QueryBatch,
    QueryCancel,
    QueryCheck,
    QueryCheckResponse,
    QueryExecute,
    QueryFlowControl,
    QueryPlan,
)
from shardex.sql.protocol.config import BeforeSend, MemberDirectory, ProtocolConfig
from shardex.sql.protocol.directory import MembershipDirectory
from shardex.sql.protocol.flow import MIN_WINDOW, ExchangeMeter, StreamStats
from shardex.sql.protocol.fragments import Fragment, FragmentContext, FragmentRegistry
from shardex.sql.protocol.member import QueryService
from shardex.sql.protocol.results import QueryMetrics, QueryResult

__all__ = [
    "MIN_WINDOW",
    "BeforeSend",
    "ExchangeMeter",
    "Fragment",
    "FragmentContext",
    "FragmentRegistry",
    "FragmentSpec",
    "MemberDirectory",
    "MembershipDirectory",
    "ProtocolConfig",
    "QueryBatch",
    "QueryCancel",
    "QueryCheck",
    "QueryCheckResponse",
    "QueryExecute",
    "QueryFlowControl",
    "QueryId",
    "QueryIdFactory",
    "QueryMetrics",
    "QueryPlan",
    "QueryResult",
    "QueryService",
    "StreamStats",
]
