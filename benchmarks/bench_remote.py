"""Slow storage: samples read over HTTP with injected latency, io_concurrency against one read
at a time and against torch's DataLoader (NOTE [reads in flight] in fastload/_io.py).

    python benchmarks/bench_remote.py [--workers 2] [--io 32] [--latency 0.05] [--n 2048]
                                      [--repeat 3]

A loopback HTTP server (127.0.0.1, in its own process, a thread per request) serves --n sample
files (uint8 96x96x3 .npy, 27 KB each), each after --latency seconds. Each case builds a loader
over a dataset that reads sample i with urllib and np.load, times construction to the first
batch, then one epoch (batch 32, --workers workers, fork). Cases: fastload with one read at a
time against a server without latency (the no-latency rate: what storage at memory speed
gives), fastload with io_concurrency=--io and with one read at a time against the slow server,
the same with thread workers (worker_method="thread": no process start), and torch's DataLoader (same workers) against the slow server. Medians of --repeat rounds, the
cases interleaved within each round; torch's epoch over the slow server is long (one read in
flight per worker), so it runs over --n / 8 samples and its rate is scaled, not its time.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402,F401  (makes fastload importable from a checkout)

import fastload  # noqa: E402


def _serve(root: str, latency: float, port_box: Any) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            time.sleep(latency)
            with open(os.path.join(root, self.path.lstrip("/")), "rb") as f:
                data = f.read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    ThreadingHTTPServer.request_queue_size = 256
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # a client gone (a loader closed with reads ahead in flight) is not an error here
    httpd.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
    httpd.daemon_threads = True
    port_box.value = httpd.server_address[1]
    httpd.serve_forever()


def start_server(root: str, latency: float) -> tuple[Any, str]:
    ctx = mp.get_context("fork")
    box = ctx.Value("i", 0)
    proc = ctx.Process(target=_serve, args=(root, latency, box), daemon=True)
    proc.start()
    while not box.value:
        time.sleep(0.01)
    return proc, f"http://127.0.0.1:{box.value}"


class Remote:
    def __init__(self, url: str, n: int) -> None:
        self.url, self.n = url, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        with urllib.request.urlopen(f"{self.url}/{i}.npy", timeout=60) as r:
            return np.load(io.BytesIO(r.read())), i


def run_fastload(url: str, n: int, workers: int, k: int,
                 method: str = "process") -> tuple[float, float]:
    t0 = time.perf_counter()
    with fastload.Loader(Remote(url, n), 32, num_workers=workers, io_concurrency=k,
                         worker_method=method,
                         start_method="fork" if method == "process" else None) as loader:
        it = iter(loader)
        next(it)
        first = time.perf_counter() - t0
        t1 = time.perf_counter()
        rows = 32 + sum(len(b[1]) for b in it)
        return first, rows / (time.perf_counter() - t1 + 1e-9)


def run_torch(url: str, n: int, workers: int) -> tuple[float, float]:
    import torch.utils.data as tud

    t0 = time.perf_counter()
    loader = tud.DataLoader(Remote(url, n), 32, num_workers=workers,
                            multiprocessing_context="fork")
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    rows = 32 + sum(len(b[1]) for b in it)
    rate = rows / (time.perf_counter() - t1 + 1e-9)
    del it, loader
    return first, rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--io", type=int, default=32)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for name in ("workers", "io", "n", "repeat"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    with tempfile.TemporaryDirectory() as root:
        for i in range(args.n):
            np.save(os.path.join(root, f"{i}.npy"), np.full((96, 96, 3), i % 251, np.uint8))
        fast_proc, fast_url = start_server(root, 0.0)
        slow_proc, slow_url = start_server(root, args.latency)
        cases: dict[str, Any] = {
            "fastload, no latency, 1 read at a time":
                lambda: run_fastload(fast_url, args.n, args.workers, 1),
            f"fastload, {args.latency * 1e3:.0f} ms, io_concurrency={args.io}":
                lambda: run_fastload(slow_url, args.n, args.workers, args.io),
            f"fastload threads, {args.latency * 1e3:.0f} ms, io_concurrency={args.io}":
                lambda: run_fastload(slow_url, args.n, args.workers, args.io, "thread"),
            "fastload threads, no latency, 1 read at a time":
                lambda: run_fastload(fast_url, args.n, args.workers, 1, "thread"),
            f"fastload, {args.latency * 1e3:.0f} ms, 1 read at a time":
                lambda: run_fastload(slow_url, args.n // 8, args.workers, 1),
        }
        if have_torch:
            cases[f"torch DataLoader, {args.latency * 1e3:.0f} ms"] = \
                lambda: run_torch(slow_url, args.n // 8, args.workers)
        results: dict[str, list[tuple[float, float]]] = {c: [] for c in cases}
        try:
            for _ in range(args.repeat):
                for name, case in cases.items():
                    results[name].append(case())
        finally:
            fast_proc.terminate()
            slow_proc.terminate()
    base = statistics.median(r for _, r in results["fastload, no latency, 1 read at a time"])
    print(f"{args.workers} workers, batch 32, uint8 96x96x3 samples over HTTP, medians of "
          f"{args.repeat}")
    print("| case | first batch (ms) | samples/s | vs no latency |")
    print("| --- | --: | --: | --: |")
    for name, rs in results.items():
        first = statistics.median(f for f, _ in rs) * 1e3
        rate = statistics.median(r for _, r in rs)
        print(f"| {name} | {first:.0f} | {rate:,.0f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
