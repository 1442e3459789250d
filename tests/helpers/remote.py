"""A loopback HTTP server with injected latency, and datasets that read their samples from it
(tests/test_io_concurrency.py; NOTE [reads in flight] in fastload/_io.py). 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import io
import os
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

import fastload


class SampleServer:
    """Serves ``<root>/<name>`` after ``latency`` seconds (``slow``: names that take
    ``slow_s``); ``hits`` counts the requests."""

    def __init__(self, root: str, latency: float = 0.05, slow: tuple[str, ...] = (),
                 slow_s: float = 30.0) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802  (http.server's name)
                server.hits += 1
                with server.lock:
                    server.active += 1
                try:
                    self._get()
                finally:
                    with server.lock:
                        server.active -= 1

            def _get(self) -> None:
                name = self.path.lstrip("/")
                time.sleep(slow_s if name in slow else latency)
                path = os.path.join(root, name)
                if not os.path.isfile(path):
                    self.send_error(404)
                    return
                with open(path, "rb") as f:
                    data = f.read()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.hits = 0
        self.active = 0  # requests being answered (their sockets are open)
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # a client gone (a loader closed with reads ahead in flight) is not an error here
        self.httpd.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no request is being answered: reads a closed loader left in flight end (and
        close their sockets) after their latency."""
        deadline = time.monotonic() + timeout
        while self.active and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # the handler thread closes its socket after do_GET returns

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def write_samples(root: str, n: int, shape: tuple[int, ...] = (8,)) -> None:
    """Sample i: a float32 array full of i, as ``<root>/<i>.npy``."""
    for i in range(n):
        np.save(os.path.join(root, f"{i}.npy"), np.full(shape, i, np.float32))


class Remote:
    """Sample i from ``<url>/<i>.npy``, plus a draw of ``sample_rng()`` and the loading worker's
    id; ``bad`` indices raise KeyError before any read."""

    def __init__(self, url: str, n: int, bad: tuple[int, ...] = ()) -> None:
        self.url, self.n, self.bad = url, n, bad

    def __len__(self) -> int:
        return self.n

    def _read(self, i: int) -> np.ndarray:
        if i in self.bad:
            raise KeyError(i)
        with urllib.request.urlopen(f"{self.url}/{i}.npy", timeout=60) as r:
            return np.load(io.BytesIO(r.read()))

    def __getitem__(self, i: int) -> Any:
        info = fastload.get_worker_info()
        return (self._read(i), fastload.sample_rng().random(),
                -1 if info is None else info.id)


class AsyncRemote(Remote):
    """Remote, as an ``async def __getitem__`` (the read runs in the default executor)."""

    async def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        loop = asyncio.get_running_loop()
        x = await loop.run_in_executor(None, self._read, i)
        return x, fastload.sample_rng().random(), -1


class Stuck:
    """Sample ``stuck`` sleeps ``stuck_s`` seconds (no file descriptor held); others load."""

    def __init__(self, n: int, stuck: int, stuck_s: float) -> None:
        self.n, self.stuck, self.stuck_s = n, stuck, stuck_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i == self.stuck:
            time.sleep(self.stuck_s)
        return np.full(4, i, np.int64)
