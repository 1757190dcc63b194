"""``cluster_dir.port_free``: a port a node could listen on now. A port whose last listener
closed with connections still in TIME_WAIT is free (a node's listener binds it), a port with
a listener is not."""

from __future__ import annotations

import socket

from shardex.meta.cluster_dir import port_free


def _time_wait_port() -> int:
    """A port whose server closed its side first: that side lingers in TIME_WAIT."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server's side closes first: TIME_WAIT is on the listening port
    client.recv(1)  # the FIN arrived
    client.close()
    server.close()
    return port


def test_a_port_in_time_wait_is_free_a_listening_one_is_not() -> None:
    port = _time_wait_port()
    plain = socket.socket()
    try:
        plain.bind(("127.0.0.1", port))  # without SO_REUSEADDR the bind is refused...
        refused = False
    except OSError:
        refused = True
    finally:
        plain.close()
    assert refused, "the connection should linger in TIME_WAIT on the port"
    assert port_free(port)  # ...but a node's listener could take it
    listener = socket.create_server(("127.0.0.1", port))
    try:
        assert not port_free(port)
    finally:
        listener.close()
