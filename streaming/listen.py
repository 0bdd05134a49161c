"""The server's listening socket, and the one-line error when it cannot be had (a module light enough to check the
port before the models load, while the server's HTTP stack is still being imported)."""

from __future__ import annotations

import errno
import socket

from speechrt.errors import UserError


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a UserError that says why not (the port is taken, the address
    is not this machine's)."""
    try:
        return socket.create_server((host, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise UserError(
                f"{host}:{port} is in use (another server, or a speechrt serve still running?): stop "
                "it, or choose another --port (0 picks a free one)"
            ) from None
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
