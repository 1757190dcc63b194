"""Wire protocol: transports, framing, typed messages, authentication, request/response.

Typical use::

    from shardex.net import TcpTransport, RpcServer, ConnectionPool, Message

    class Get(Message):
        key: str

    server = RpcServer(TcpTransport(), secret, name="node-1")
    server.route(Get, handle_get)          # async def handle_get(msg, conn) -> Message | None
    address = await server.start("127.0.0.1:0")

    pool = ConnectionPool(TcpTransport(), secret, name="client")
    reply = await pool.request(address, Get(key="k"), timeout=5.0)

See docs/protocol.md for the bytes on the wire.
"""

from shardex.net.credentials import Credentials, NodeSecret, Principal, UserLogin
from shardex.net.messages import (
    PROTOCOL_VERSION,
    Ack,
    Envelope,
    ErrorReply,
    Kind,
    Message,
    Ping,
    Pong,
    decode_frame,
    encode_frame,
    registered_messages,
)
from shardex.net.rpc import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    Connection,
    ConnectionPool,
    Handler,
    Router,
    RpcServer,
    connect,
)
from shardex.net.tcp import TcpTransport
from shardex.net.transport import DEFAULT_MAX_FRAME, Comm, Listener, Transport

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_FRAME",
    "DEFAULT_REQUEST_TIMEOUT",
    "PROTOCOL_VERSION",
    "Ack",
    "Comm",
    "Connection",
    "ConnectionPool",
    "Credentials",
    "Envelope",
    "ErrorReply",
    "Handler",
    "Kind",
    "Listener",
    "Message",
    "NodeSecret",
    "Ping",
    "Pong",
    "Principal",
    "Router",
    "RpcServer",
    "TcpTransport",
    "Transport",
    "UserLogin",
    "connect",
    "decode_frame",
    "encode_frame",
    "registered_messages",
]
