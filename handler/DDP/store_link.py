"""A store client whose every call returns within a bound, for the heartbeat (peers.py).

TCPStore's client has no read timeout: a call to a store that is cut off (no FIN, no RST: a
pulled cable, a partitioned host) waits for ever, and so would the heartbeat thread making
it. Here the client talks to the store through a relay of ours, a thread on a loopback port
that closes the client's connection when the store's answer is later than `limit_s`, or when
the link is closed. The call then fails at once ("connection closed") instead of hanging.
"""
import datetime
import select
import socket
import threading
import time
from typing import Dict, List, Optional, Set

import torch.distributed as tdist

TICK_S = 0.1  # how often the relay looks at the clock while nothing arrives


class BoundedStore:
    """A TCPStore client to host:port whose calls end within about limit_s (close() ends them
    at once). Raises OSError when the store does not accept a connection."""

    def __init__(self, host: str, port: int, limit_s: float):
        # A plain socket first: a TCPStore that cannot connect logs a C++ backtrace.
        socket.create_connection((host, port), timeout=limit_s).close()
        self.upstream, self.limit_s = (host, port), limit_s
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(4)
        self._closed = threading.Event()
        self._peer: Dict[socket.socket, socket.socket] = {}  # each end of a relayed connection -> the other
        self._clients: Set[socket.socket] = set()
        self._waiting: Dict[socket.socket, float] = {}  # client -> when its request went to the store
        self._thread = threading.Thread(target=self._relay, name="harness-store-relay", daemon=True)
        self._thread.start()
        try:
            self.store = tdist.TCPStore("127.0.0.1", self._listener.getsockname()[1], is_master=False,  # pyright: ignore[reportPrivateImportUsage]  # public API; torch.distributed re-exports it without __all__
                                        wait_for_workers=False, timeout=datetime.timedelta(seconds=limit_s))
        except Exception:
            self.close()
            raise

    def add(self, key: str, amount: int) -> int:
        return self.store.add(key, amount)

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def get(self, key: str) -> Optional[bytes]:
        """The key's value; None when nobody set it (a plain get would wait for it)."""
        return self.store.get(key) if self.store.check([key]) else None

    def close(self) -> None:
        """Drop every connection (a call in flight fails at once) and stop the relay."""
        self._closed.set()
        self._thread.join(timeout=5 * TICK_S + 1)

    def _relay(self) -> None:
        try:
            while not self._closed.is_set():
                ready: List[socket.socket] = select.select([self._listener, *self._peer], [], [], TICK_S)[0]
                if self._listener in ready:
                    self._accept()
                for s in ready:
                    if s in self._peer and not self._pass(s):
                        self._drop(s)
                now = time.monotonic()
                for client in [c for c, t in self._waiting.items() if now - t > self.limit_s]:
                    self._drop(client)
        finally:
            for s in list(self._peer):
                s.close()
            self._listener.close()

    def _accept(self) -> None:
        client = self._listener.accept()[0]
        try:
            store = socket.create_connection(self.upstream, timeout=self.limit_s)
        except OSError:
            client.close()
            return
        self._peer[client], self._peer[store] = store, client
        self._clients.add(client)

    def _pass(self, s: socket.socket) -> bool:
        """Forward what s sent; False when s closed or failed. A client's request starts the
        clock; the store's answer stops it."""
        try:
            data = s.recv(65536)
            if not data:
                return False
            self._peer[s].sendall(data)
        except OSError:
            return False
        if s in self._clients:
            self._waiting.setdefault(s, time.monotonic())
        else:
            self._waiting.pop(self._peer[s], None)
        return True

    def _drop(self, s: socket.socket) -> None:
        """Close both ends of s's connection: the client's call in flight fails."""
        other = self._peer.pop(s, None)
        for x in (s, other):
            if x is not None:
                self._peer.pop(x, None)
                self._waiting.pop(x, None)
                self._clients.discard(x)
                x.close()
