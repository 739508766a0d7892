"""local/cluster.py's ports: picked where no one else's bind(0) or connect() can take them before
the process they are for binds them."""

from __future__ import annotations

import socket

from local.cluster import STABLE_PORTS, ephemeral_low, free_port


def test_a_picked_port_is_below_the_ephemeral_range_and_free_to_bind():
    low = ephemeral_low()
    picked = {free_port() for _ in range(20)}
    assert all(port in STABLE_PORTS and port < low for port in picked), picked
    port = picked.pop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_picked():
    held = []
    try:
        for _ in range(5):
            port = free_port()
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.bind(("127.0.0.1", port))
            server.listen()
            held.append(server)
        assert len({server.getsockname()[1] for server in held}) == len(held)
    finally:
        for server in held:
            server.close()
