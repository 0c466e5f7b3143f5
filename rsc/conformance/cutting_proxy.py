"""A TCP proxy to Redis that loses replies: for a share of the replies to append scripts
(`EVALSHA`/`EVAL`), it drops the reply and closes both connections. Redis ran the request, the
client never hears of it: what a network blip, an idle cut by a load balancer or a failover does
to a producer. The conformance kit's `producer-cut-replies` scenario runs the client under
test's producer through it (rule P6).

Threads and blocking sockets (the kit is a test driver): one thread accepts, two pump each
connection. Closed with the `with` block.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from types import TracebackType


class CuttingProxy:
    """Listens on 127.0.0.1 (`port`, `url`) and forwards to Redis on `upstream_port`."""

    def __init__(self, upstream_port: int, share: float, seed: int = 0) -> None:
        self.upstream_port = upstream_port
        self.share = share
        self.rng = random.Random(seed)
        self.cuts = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            _shut(s)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                _shut(client)
                continue
            with self._lock:
                self._sockets += [client, upstream]
            appending = threading.Event()  # a request to an append script is waiting for its reply
            threading.Thread(target=self._requests, args=(client, upstream, appending), daemon=True).start()
            threading.Thread(target=self._replies, args=(upstream, client, appending), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket, appending: threading.Event) -> None:
        try:
            while data := client.recv(65_536):
                if b"EVALSHA" in data.upper() or b"EVAL" in data.upper():
                    appending.set()
                upstream.sendall(data)
        except OSError:
            pass
        _shut(client)
        _shut(upstream)

    def _replies(self, upstream: socket.socket, client: socket.socket, appending: threading.Event) -> None:
        try:
            while data := upstream.recv(65_536):
                if appending.is_set():
                    appending.clear()
                    with self._lock:
                        cut = self.rng.random() < self.share
                        self.cuts += cut
                    if cut:
                        break  # Redis ran it; the reply is lost and both connections close
                client.sendall(data)
        except OSError:
            pass
        _shut(client)
        _shut(upstream)


def _shut(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
