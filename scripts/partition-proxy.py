#!/usr/bin/env python3
"""A loopback TCP proxy that can cut its connections off the way a partition
does: no byte goes either way, and every socket stays open (no FIN, no RST).

    scripts/partition-proxy.py HOST:PORT

prints the port it listens on (127.0.0.1) as its first line, then reads
commands on stdin, one a line, and answers each with "ok":

    cut    stop carrying bytes both ways (connections made meanwhile are
           accepted and carried nowhere)
    heal   carry them again: nothing sent meanwhile is lost, as with TCP
    quit   close everything and exit (so does the end of stdin)

The benchmarks (make bench-clients) run each client's holder through one, so
that the holder's process is cut off while its connections stay open.
"""

import socket
import sys
import threading

flowing = threading.Event()
flowing.set()
# Held while bytes (or an end) are passed on, and by `cut`: once `cut` has
# answered, nothing more goes either way.
gate = threading.Lock()


def pass_on(act) -> None:
    """Runs act() once the proxy is flowing, never while it is cut."""
    while True:
        flowing.wait()
        with gate:
            if flowing.is_set():
                act()
                return


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copies src to dst while flowing; while cut, reads nothing more, so that
    the bytes wait in the kernel's buffers as they would behind a partition,
    and holds what it had read, an end of the connection (EOF, a reset)
    included, until the heal."""
    try:
        while True:
            flowing.wait()
            data = src.recv(65536)
            if not data:
                break
            pass_on(lambda: dst.sendall(data))
    except OSError:
        pass
    finally:
        pass_on(lambda: shut(src, dst))


def shut(*sockets: socket.socket) -> None:
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(listener: socket.socket, upstream: tuple) -> None:
    while True:
        client, _ = listener.accept()
        server = socket.create_connection(upstream)
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(client, server), daemon=True).start()
        threading.Thread(target=pump, args=(server, client), daemon=True).start()


def main() -> None:
    host, port = sys.argv[1].rsplit(":", 1)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    print(listener.getsockname()[1], flush=True)
    threading.Thread(target=serve, args=(listener, (host, int(port))), daemon=True).start()
    for line in sys.stdin:
        command = line.strip()
        if command == "cut":
            with gate:
                flowing.clear()
        elif command == "heal":
            flowing.set()
        elif command == "quit":
            break
        else:
            print(f"unknown command {command!r}: cut, heal or quit", flush=True)
            continue
        print("ok", flush=True)


if __name__ == "__main__":
    main()
