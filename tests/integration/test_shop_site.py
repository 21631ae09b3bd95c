"""The copy-guard benchmark's shop-like site (bench/copy_guard/site.py) behind the real stack's
nginx: product pages do uncached reads of the data file, checkouts append fsync'd orders."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.copy_guard.site import DATA_NAME, ORDERS_NAME, ensure_data_file, site_component
from promreflex.config import Ports, load_config
from promreflex.proc import free_port, pid_alive, wait_until
from promreflex.stack import Stack

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def running_shop(prefix: str = "promreflex-shop-") -> Iterator[tuple[Stack, Path, int]]:
    """The stack with nginx proxying to a small shop site; stopped (every PID checked) and
    removed on exit. A mkdtemp root (0755), not tmp_path: nginx workers run as nobody."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    data_dir, site_port = root / "data", free_port()
    cfg = load_config(None, {
        "stack.state_dir": str(root / "stack"),
        "stack.ports": {p: free_port() for p in Ports.model_fields},
        "stack.upstream": f"127.0.0.1:{site_port}",
        "controller.routes": [],
    })
    site = site_component(site_port, data_dir, data_size_mib=8, reads_per_page=4, workers=2)
    stack = Stack(cfg, extra_components=[site])
    pids: dict[str, int] = {}
    try:
        stack.up(progress=lambda *_: None)
        pids = dict(stack.running())
        yield stack, data_dir, site_port
    finally:
        stack.down(quiet=True)
        shutil.rmtree(root, ignore_errors=True)
    for name, pid in pids.items():
        assert not pid_alive(pid), f"{name} (pid {pid}) survived stack down"


def _get(url: str, data: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
        return resp.status, resp.read()


@pytest.fixture()
def shop():
    with running_shop() as running:
        yield running


def test_pages_read_the_disk_uncached_and_checkouts_commit_behind_nginx(shop):
    stack, data_dir, site_port = shop
    nginx = stack.url("nginx")
    site = f"http://127.0.0.1:{site_port}"
    assert (data_dir / DATA_NAME).stat().st_size == 8 << 20
    _, before = _get(f"{site}/stats")
    before = json.loads(before)
    assert before["direct_io"] is True  # O_DIRECT accepted on this file system

    for i in range(5):
        status, body = _get(f"{nginx}/product/{i}")
        assert status == 200 and f"Product {i}".encode() in body
    status, body = _get(f"{nginx}/checkout", b"cart=1")
    assert status == 200 and json.loads(body) == {"ok": True}
    with pytest.raises(urllib.error.HTTPError) as e:
        _get(f"{nginx}/nope")
    assert e.value.code == 404

    after = json.loads(_get(f"{site}/stats")[1])
    assert after["pages"] - before["pages"] == 5
    assert after["reads"] - before["reads"] == 5 * 4
    assert after["read_bytes"] - before["read_bytes"] == 5 * 4 * 64 * 1024
    assert after["commits"] - before["commits"] == 1
    orders = (data_dir / ORDERS_NAME).read_text().splitlines()
    assert len(orders) == 1 and json.loads(orders[0])["kind"] == "checkout"

    # nginx logged the proxied requests, and the access-log exporter counted them for site "shop"
    def served() -> float:
        with urllib.request.urlopen(f"{stack.url('accesslog_exporter')}/metrics", timeout=5) as resp:  # noqa: S310
            text = resp.read().decode()
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith('promreflex_http_requests_total{site="shop",status_class="2xx"'))

    wait_until(lambda: served() >= 6, timeout=30, what="6 served requests counted")
    assert served() == 6


def test_data_file_is_reused_when_its_size_matches(tmp_path):
    path = tmp_path / DATA_NAME
    assert ensure_data_file(path, 1 << 20) is True
    first = path.read_bytes()[:4096]
    assert ensure_data_file(path, 1 << 20) is False
    assert path.read_bytes()[:4096] == first
    assert ensure_data_file(path, 2 << 20) is True and path.stat().st_size == 2 << 20
    with pytest.raises(ValueError):
        ensure_data_file(path, 1000)


def test_store_reads_with_o_direct_and_fsyncs_each_commit(tmp_path, monkeypatch):
    import os

    from bench.copy_guard.site import DiskStore, SiteConfig

    ensure_data_file(tmp_path / DATA_NAME, 4 << 20)
    store = DiskStore(SiteConfig(tmp_path, 4 << 20, read_size=64 << 10, reads_per_page=3))
    try:
        flags = int(next(line.split()[1] for line in Path(f"/proc/self/fdinfo/{store.fd}").read_text().splitlines()
                         if line.startswith("flags:")), 8)
        assert flags & os.O_DIRECT, "the product file is not opened with O_DIRECT"
        offsets = []
        real_preadv = os.preadv
        monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: offsets.append(off) or real_preadv(fd, bufs, off))
        synced = []
        real_fsync = os.fsync
        monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
        store.product(1)
        store.product(1)
        assert len(offsets) == 6 and all(o % (64 << 10) == 0 and o < 4 << 20 for o in offsets)
        assert len(set(offsets)) > 1  # random offsets, not one cached block
        store.commit({"kind": "checkout"})
        store.commit({"kind": "cart"})
        assert synced == [store.orders_fd, store.orders_fd]
        assert len((tmp_path / ORDERS_NAME).read_text().splitlines()) == 2
    finally:
        store.close()
