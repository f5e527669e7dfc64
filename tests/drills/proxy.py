"""A plain TCP forwarder, 127.0.0.1:LISTEN → 127.0.0.1:TARGET: the drills' S3 front door.

    python -m tests.drills.proxy LISTEN_PORT TARGET_PORT

Killing it is an S3 outage whose storage survives: open connections are cut and new ones refused
until it runs again on the same port.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(262144):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((target, socket.SHUT_WR), (source, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                sock.shutdown(how)


def _serve(client: socket.socket, port: int) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main() -> None:
    listen, target = int(sys.argv[1]), int(sys.argv[2])
    server = socket.create_server(("127.0.0.1", listen), backlog=128)
    while True:
        client, _ = server.accept()
        threading.Thread(target=_serve, args=(client, target), daemon=True).start()


if __name__ == "__main__":
    main()
