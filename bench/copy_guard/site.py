"""A shop-like backend whose pages do real disk work, for the copy-guard benchmark and tests.

Like a shop whose database does not fit in memory:

- ``GET /product/<id>`` (and ``GET /``, a random product) reads ``--reads-per-page`` blocks of
  ``--read-size`` bytes at random offsets of a large data file, uncached: the file is opened
  with ``O_DIRECT`` (page cache bypassed; aligned buffer from an anonymous mmap), or, where the
  file system refuses O_DIRECT (tmpfs), ``posix_fadvise(DONTNEED)`` drops the range before each
  read. So every page costs disk time, and a copy on the same disk competes for it.
- ``POST /cart`` and ``POST /checkout`` append one order line to ``orders.log`` and ``fsync`` it:
  a commit.
- ``GET /healthz`` answers without touching the disk (readiness).

Concurrency is bounded: one accept loop hands connections to ``--workers`` threads through an
unbounded queue, so overload shows as queueing (latency), never as extra parallelism. Every
response closes its connection (HTTP/1.0 style), which is what nginx does with its upstream
unless told to keep connections alive.

Loopback only. The data file is created (random, incompressible bytes) when missing or of the
wrong size and reused otherwise; put ``--data-dir`` on the same disk as the copy.

    python -m bench.copy_guard.site --web.listen-address 127.0.0.1:8090 --data-dir /var/tmp/shop
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import queue
import random
import re
import signal
import socket
import socketserver
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from promreflex.config import is_loopback, split_host_port

DATA_NAME = "products.dat"
ORDERS_NAME = "orders.log"
ALIGN = 4096
_PRODUCT = re.compile(r"^/product/(\d{1,9})$")


@dataclass
class SiteConfig:
    data_dir: Path
    data_bytes: int = 1 << 30
    read_size: int = 64 * 1024
    reads_per_page: int = 16
    workers: int = 4
    products: int = 10_000


def ensure_data_file(path: Path, size: int, chunk: int = 8 << 20, progress=None, repeat: bool = False) -> bool:
    """Create ``path`` with ``size`` random bytes unless it already has that size. True if written.
    ``repeat``: one random ``chunk`` written over and over (fast; fine for a copy's source, which
    nothing compresses or deduplicates)."""
    if size % ALIGN:
        raise ValueError(f"data size must be a multiple of {ALIGN}")
    try:
        if path.stat().st_size == size:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    block = os.urandom(chunk) if repeat else b""
    with open(tmp, "wb") as f:
        done = 0
        while done < size:
            n = min(chunk, size - done)
            f.write(block[:n] if repeat else os.urandom(n))  # random: incompressible, no two chunks alike
            done += n
            if progress and done % (1 << 30) == 0:
                progress(f"  writing {path.name}: {done >> 20} MiB of {size >> 20} MiB")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return True


class DiskStore:
    """Uncached random reads of the product file and fsync'd appends to the order log."""

    def __init__(self, cfg: SiteConfig):
        self.cfg = cfg
        if cfg.read_size % ALIGN or cfg.read_size <= 0:
            raise ValueError(f"read size must be a positive multiple of {ALIGN}")
        self.data_path = cfg.data_dir / DATA_NAME
        self.orders_path = cfg.data_dir / ORDERS_NAME
        self.size = self.data_path.stat().st_size
        self.blocks = self.size // cfg.read_size
        if self.blocks < 1:
            raise ValueError(f"{self.data_path} is smaller than one read ({cfg.read_size} bytes)")
        try:
            self.fd = os.open(self.data_path, os.O_RDONLY | os.O_DIRECT)
            self.direct = True
        except OSError:
            self.fd = os.open(self.data_path, os.O_RDONLY)
            self.direct = False
        self.orders_fd = os.open(self.orders_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.local = threading.local()
        self.lock = threading.Lock()
        self.counts = {"pages": 0, "reads": 0, "read_bytes": 0, "commits": 0}

    def _buffer(self) -> mmap.mmap:
        buf = getattr(self.local, "buf", None)
        if buf is None:
            buf = self.local.buf = mmap.mmap(-1, self.cfg.read_size)  # page-aligned, as O_DIRECT needs
        return buf

    def product(self, product_id: int) -> int:
        """Read the product's blocks (spread over the file by the id); returns a checksum."""
        rng = random.Random(product_id * 7919 + random.getrandbits(16))
        buf, crc = self._buffer(), 0
        for _ in range(self.cfg.reads_per_page):
            offset = rng.randrange(self.blocks) * self.cfg.read_size
            if not self.direct:
                os.posix_fadvise(self.fd, offset, self.cfg.read_size, os.POSIX_FADV_DONTNEED)
            n = os.preadv(self.fd, [buf], offset)
            crc = zlib.crc32(buf[:64], crc)
            with self.lock:
                self.counts["reads"] += 1
                self.counts["read_bytes"] += n
        with self.lock:
            self.counts["pages"] += 1
        return crc

    def commit(self, record: dict) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        os.write(self.orders_fd, line)
        os.fsync(self.orders_fd)
        with self.lock:
            self.counts["commits"] += 1

    def close(self) -> None:
        for fd in (self.fd, self.orders_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class ShopHandler(BaseHTTPRequestHandler):
    server_version = "promreflex-shop/1"
    protocol_version = "HTTP/1.0"
    store: DiskStore  # set on the subclass made by make_server

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature; nginx logs requests
        pass

    def _send(self, code: int, body: bytes, ctype: str = "text/html; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, b"ok\n", "text/plain")
            return
        if path == "/stats":
            with self.store.lock:
                body = json.dumps({**self.store.counts, "direct_io": self.store.direct}).encode()
            self._send(200, body, "application/json")
            return
        m = _PRODUCT.match(path)
        if path == "/":
            pid = random.randrange(self.store.cfg.products)
        elif m:
            pid = int(m.group(1)) % self.store.cfg.products
        else:
            self._send(404, b"not found\n", "text/plain")
            return
        crc = self.store.product(pid)
        self._send(200, (f"<!doctype html><title>Product {pid}</title><h1>Product {pid}</h1>"
                         f"<p>stock record {crc:08x}</p><form method=post action=/cart><button>Add</button></form>\n").encode())

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path not in ("/cart", "/checkout"):
            self._send(404, b"not found\n", "text/plain")
            return
        try:
            length = min(int(self.headers.get("Content-Length") or 0), 64 * 1024)
        except ValueError:
            self._send(400, b"bad Content-Length\n", "text/plain")
            return
        body = self.rfile.read(length) if length else b""
        self.store.commit({"ts": round(time.time(), 3), "kind": path[1:], "bytes": len(body)})
        self._send(200, b'{"ok":true}\n', "application/json")


class BoundedServer(socketserver.TCPServer):
    """Accepts eagerly, serves with a fixed pool of worker threads; waiting connections queue."""

    allow_reuse_address = True
    request_queue_size = 1024
    daemon_threads = True

    def __init__(self, address, handler, workers: int):
        super().__init__(address, handler)
        self.pending: queue.Queue = queue.Queue()
        self.workers = [threading.Thread(target=self._work, daemon=True, name=f"shop-worker-{i}") for i in range(workers)]
        for t in self.workers:
            t.start()

    def process_request(self, request, client_address) -> None:
        self.pending.put((request, client_address))

    def _work(self) -> None:
        while True:
            item = self.pending.get()
            if item is None:
                return
            request, addr = item
            try:
                self.finish_request(request, addr)
            except Exception:  # noqa: BLE001 - one broken connection must not kill a worker
                self.handle_error(request, addr)
            finally:
                self.shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        pass  # client went away (nginx timeout); nothing to report per request

    def server_close(self) -> None:
        for _ in self.workers:
            self.pending.put(None)
        super().server_close()


def make_server(host: str, port: int, store: DiskStore, workers: int) -> BoundedServer:
    if not is_loopback(host):
        raise ValueError(f"the shop site listens on loopback only, not {host}")
    handler = type("BoundShopHandler", (ShopHandler,), {"store": store})
    return BoundedServer((host, port), handler, workers)


def site_component(port: int, data_dir: Path, *, data_size_mib: int = 1024, reads_per_page: int = 24,
                   workers: int = 4, cgroup: Path | None = None, name: str = "shop_site"):
    """The site as an extra component of :class:`promreflex.stack.Stack` (point ``stack.upstream``
    at ``127.0.0.1:<port>``)."""
    from promreflex.stack import Component

    argv = [sys.executable, "-m", "bench.copy_guard.site", "--web.listen-address", f"127.0.0.1:{port}",
            "--data-dir", str(data_dir), "--data-size", f"{data_size_mib}MiB",
            "--reads-per-page", str(reads_per_page), "--workers", str(workers)]
    if cgroup is not None:
        argv += ["--cgroup", str(cgroup)]
    return Component(name, port, f"http://127.0.0.1:{port}/healthz", argv)


def join_cgroup(path: Path) -> None:
    """Move this process into a cgroup (v1 blkio: the benchmark's emulated disk)."""
    (path / "cgroup.procs").write_text(f"{os.getpid()}\n")


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]i?B?)?", text.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512MiB, 1GiB)")
    unit = (m.group(2) or "").upper()[:1]
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.copy_guard.site", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--web.listen-address", dest="listen", default="127.0.0.1:8090")
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--data-size", type=parse_size, default=1 << 30, help="product file size (default 1GiB)")
    ap.add_argument("--read-size", type=parse_size, default=64 << 10, help="bytes per uncached read (default 64KiB)")
    ap.add_argument("--reads-per-page", type=int, default=16)
    ap.add_argument("--workers", type=int, default=4, help="requests served at once; the rest queue")
    ap.add_argument("--cgroup", type=Path, help="join this cgroup (its cgroup.procs) before serving")
    args = ap.parse_args(argv)
    host, port = split_host_port(args.listen)
    if args.workers < 1 or args.reads_per_page < 0:
        ap.error("--workers must be >= 1 and --reads-per-page >= 0")
    if args.cgroup:
        join_cgroup(args.cgroup)
    cfg = SiteConfig(args.data_dir, args.data_size, args.read_size, args.reads_per_page, args.workers)
    if ensure_data_file(cfg.data_dir / DATA_NAME, cfg.data_bytes, progress=lambda s: print(s, flush=True)):
        print(f"wrote {cfg.data_dir / DATA_NAME}", flush=True)
    store = DiskStore(cfg)
    server = make_server(host, port, store, args.workers)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(f"shop site on http://{host}:{port}/ workers={args.workers} reads/page={cfg.reads_per_page}x"
          f"{cfg.read_size} direct_io={store.direct}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        store.close()
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    sys.exit(main())
