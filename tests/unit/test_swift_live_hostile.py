"""``swift-timing serve --live`` against hostile streams and arguments: far-future stamps, a
tcpdump that fails or writes no capture, duplicate nodes, missing executables, zero durations."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporters.swift.cli import main
from exporters.swift.live import LiveAnalyzer, LiveSource, StreamHealth, run_live
from exporters.swift.metrics import SwiftTimingCollector
from exporters.swift.roles import RoleMap
from exporters.swift.synth import NODES, SynthNet, roles_mapping, swift_put
from promreflex.proc import free_port, pid_alive, wait_until

T0 = 1_795_448_405_000_000_000
MS = 1_000_000
FUTURE_S = 0xF0000000  # year 2097


def _roles() -> RoleMap:
    r = RoleMap()
    r.add_mapping_dict(roles_mapping())
    return r


def _paths(tmp: Path, n: int = 6) -> dict[str, Path]:
    net = SynthNet(dict(NODES))
    t = T0
    for i in range(n):
        t = swift_put(net, t, f"tx{i}", object_ns=2 * MS) + 400 * MS
    return net.write(tmp)


def _records(data: bytes) -> tuple[bytes, list[bytes]]:
    """A pcap (little endian, as synth writes it): its header and its records."""
    off, recs = 24, []
    while off + 16 <= len(data):
        (cap,) = struct.unpack_from("<I", data, off + 8)
        recs.append(data[off:off + 16 + cap])
        off += 16 + cap
    return data[:24], recs


def _future(rec: bytes) -> bytes:
    r = bytearray(rec)
    struct.pack_into("<I", r, 0, FUTURE_S)
    return bytes(r)


def test_far_future_packet_is_dropped_and_windows_go_on(tmp_path: Path) -> None:
    """One packet stamped in 2097 must not move the cut there (every later window would be empty)."""
    paths = _paths(tmp_path)
    reg = CollectorRegistry()
    live = LiveAnalyzer(list(paths), _roles(), SwiftTimingCollector(list(paths), registry=reg), grace_s=0.2, keep_s=5)
    split = {n: _records(p.read_bytes()) for n, p in paths.items()}
    for n, (head, recs) in split.items():
        live.feed(n, head + b"".join(recs[:len(recs) // 2]))
    live.feed("proxy", _future(split["proxy"][1][0]))
    live.tick()
    for n, (_, recs) in split.items():
        live.feed(n, b"".join(recs[len(recs) // 2:]))
    newest = max(live.latest.values())
    live.tick(now_ns=newest + 11_000_000_000)
    g = reg.get_sample_value
    assert g("promreflex_swift_node_processing_seconds_count", {"node": "storage", "role": "object"}) == 6
    assert g("promreflex_swift_packets_rejected_total", {"node": "proxy", "reason": "bad_timestamp"}) == 1
    # dropped before the parser's clock check: the packets after it are not "clock_backwards"
    assert g("promreflex_swift_packets_rejected_total", {"node": "proxy", "reason": "clock_backwards"}) == 0


def test_a_node_stamping_ahead_does_not_hold_the_others_back(tmp_path: Path) -> None:
    """A node whose clock runs ahead (less than `keep`: kept) must not make the others look idle
    and move the cut past what they send next."""
    paths = _paths(tmp_path, n=4)
    reg = CollectorRegistry()
    live = LiveAnalyzer(list(paths), _roles(), SwiftTimingCollector(list(paths), registry=reg), grace_s=0.2, keep_s=600)
    split = {n: _records(p.read_bytes()) for n, p in paths.items()}
    for n, (head, recs) in split.items():
        live.feed(n, head + b"".join(recs[:len(recs) // 2]))
    mid = max(live.latest.values())
    live.latest["ahead"] = mid + 400 * 1_000_000_000  # under keep, beyond keep/2
    live.tick(now_ns=mid + 1_000_000)
    for n, (_, recs) in split.items():
        live.feed(n, b"".join(recs[len(recs) // 2:]))
    last = max(t for n, t in live.latest.items() if n != "ahead")
    live.tick(now_ns=last + 3_000_000_000)
    got = reg.get_sample_value("promreflex_swift_node_processing_seconds_count", {"node": "storage", "role": "object"})
    assert got == 4


def test_packet_counts_are_published_without_a_window(tmp_path: Path) -> None:
    """Packets read are counted on every tick, also when no window can be cut."""
    paths = _paths(tmp_path, n=1)
    reg = CollectorRegistry()
    live = LiveAnalyzer(list(paths), _roles(), SwiftTimingCollector(list(paths), registry=reg), grace_s=0.2, keep_s=5)
    head, recs = _records(paths["proxy"].read_bytes())
    live.feed("proxy", head + b"".join(_future(r) for r in recs[:3]))
    assert not live.tick(now_ns=T0)
    g = reg.get_sample_value
    assert g("promreflex_swift_packets_total", {"node": "proxy"}) == 3
    assert g("promreflex_swift_packets_rejected_total", {"node": "proxy", "reason": "bad_timestamp"}) == 3


FAKE_TCPDUMP = """#!/bin/sh
echo $$ >> "$FAKE_PIDS"
while [ $# -gt 0 ]; do [ "$1" = "-i" ] && IF=$2; shift; done
case "$IF" in
  ok) cat "$FAKE_DIR/ok.pcap"; exec sleep 1000 ;;
  text) echo "tcpdump: listening on text, link-type EN10MB"; exec sleep 1000 ;;
  *) echo "tcpdump: $IF: No such device exists" >&2; exit 1 ;;
esac
"""


@pytest.fixture()
def fake_tcpdump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "tcpdump"
    exe.write_text(FAKE_TCPDUMP)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PIDS", str(tmp_path / "pids"))
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    return tmp_path


def test_failing_streams_are_counted_logged_restarted_and_spare_the_others(fake_tcpdump: Path, caplog) -> None:
    """Source ok delivers; text writes no capture (CaptureError); gone's tcpdump exits 1 at once.
    The live loop goes on; each failure is counted, logged with what tcpdump said, and retried."""
    tmp = fake_tcpdump
    paths = _paths(tmp, n=2)
    (tmp / "ok.pcap").write_bytes(paths["proxy"].read_bytes())
    nodes = ["proxy", "text", "gone"]
    reg = CollectorRegistry()
    live = LiveAnalyzer(nodes, _roles(), SwiftTimingCollector(nodes, registry=reg), grace_s=0.2, keep_s=5)
    health = StreamHealth(nodes, registry=reg)
    sources = [LiveSource("proxy", "ok"), LiveSource("text", "text"), LiveSource("gone", "nosuchif0")]
    g = reg.get_sample_value

    def ready() -> bool:
        return ((g("promreflex_swift_stream_failures_total", {"node": "text"}) or 0) >= 2
                and (g("promreflex_swift_stream_failures_total", {"node": "gone"}) or 0) >= 2
                and g("promreflex_swift_stream_up", {"node": "proxy"}) == 1
                and (g("promreflex_swift_packets_total", {"node": "proxy"}) or 0) > 0)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(run_live(sources, live, stop, interval_s=0.05, health=health, backoff=(0.05, 0.2)))
        for _ in range(200):
            if ready() or task.done():
                break
            await asyncio.sleep(0.05)
        assert ready() and not task.done()
        assert g("promreflex_swift_stream_up", {"node": "text"}) == 0
        assert g("promreflex_swift_stream_up", {"node": "gone"}) == 0
        stop.set()
        await asyncio.wait_for(task, 10)

    with caplog.at_level(logging.WARNING, logger="promreflex.exporter.swift"):
        asyncio.run(asyncio.wait_for(scenario(), 30))
    assert "tcpdump exited with code 1: tcpdump: nosuchif0: No such device exists" in caplog.text
    assert "CaptureError: not a pcap or pcapng capture" in caplog.text
    assert "never retrieved" not in caplog.text
    pids = [int(x) for x in (tmp / "pids").read_text().split()]
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=10)


@pytest.fixture()
def roles_file(tmp_path: Path) -> str:
    f = tmp_path / "roles.json"
    f.write_text(json.dumps(roles_mapping()))
    return f"--roles={f}"


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], *want: str) -> None:
    assert main(["serve", *argv, f"--web.listen-address=127.0.0.1:{free_port()}"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(w in err for w in want), err


def test_same_live_node_twice_is_refused(roles_file: str, capsys) -> None:
    _one_line_error(capsys, [roles_file, "--live=client=lo", "--live=client=eth0"], "'client' given twice")


def test_missing_executables_are_named(roles_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys) -> None:
    empty = tmp_path / "emptybin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    _one_line_error(capsys, [roles_file, "--live=client=eth0@ns1"], "needs ip and tcpdump", "not found")
    _one_line_error(capsys, [roles_file, "--live=client=eth0"], "needs tcpdump")


@pytest.mark.parametrize("args,want", [
    (["--interval=0s"], "--interval: must be above 0"),
    (["--keep=0s"], "--keep: must be above 0"),
    (["--grace=-1s"], "--grace: cannot be negative"),
    (["--grace", "-1s"], "--grace: cannot be negative"),  # a value, not an option (argparse said "expected one argument")
    (["--interval", "-0.5s"], "--interval: must be above 0"),
])
def test_live_durations_are_checked(roles_file: str, capsys, args: list[str], want: str) -> None:
    _one_line_error(capsys, [roles_file, "--live=client=lo", *args], want)
