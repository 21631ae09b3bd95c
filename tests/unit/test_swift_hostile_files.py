"""swift-timing with hostile input files: short pcapng blocks, a capture cut while it is read,
a packet stamped decades away, a huge non-capture, bad role files and bad analyze/diagram options:
each counted or a one-line error, never a traceback or a signal."""

from __future__ import annotations

import gzip
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exporters.swift.cli import main
from exporters.swift.pcap import ACK, PSH, StreamParser, read_capture
from exporters.swift.roles import RoleError, load_roles
from exporters.swift.synth import tcp_packet, write_pcap

T0 = 1_795_448_405_000_000_000
REPO = Path(__file__).resolve().parents[2]


def _block(btype: int, body: bytes) -> bytes:
    body += b"\x00" * (-len(body) % 4)
    n = len(body) + 12
    return struct.pack("<II", btype, n) + body + struct.pack("<I", n)


_SHB = _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
_IDB = _block(1, struct.pack("<HHI", 1, 0, 65535))
_PKT = tcp_packet("10.0.0.1", "10.0.0.2", 1, 2, 3, 4, PSH | ACK, b"GET / HTTP/1.1\r\n")
_EPB = _block(6, struct.pack("<IIIII", 0, 0, 1000, len(_PKT), len(_PKT)) + _PKT)


def _short(btype: int, blen: int) -> bytes:
    """A block of ``blen`` bytes (header, zeros, trailing length): too short for its fields."""
    return struct.pack("<II", btype, blen) + b"\0" * (blen - 12) + struct.pack("<I", blen)


@pytest.mark.parametrize("data,kept,corrupt", [
    (_SHB + _short(1, 12), 0, 1),  # IDB without link type, at the end
    (_SHB + _short(1, 16), 0, 1),
    (_SHB + _short(1, 12) + _EPB, 0, 2),  # its packets: corrupt too (not the next block's bytes)
    (_SHB + _IDB + _EPB + _short(6, 12), 1, 1),  # EPB without its header fields
    (_SHB + _IDB + _EPB + _short(6, 28), 1, 1),  # EPB without its trailing length
    # EPB whose captured length runs into the trailing length field
    (_SHB + _IDB + struct.pack("<IIIIIII", 6, 32, 0, 0, 1000, 4, 4) + struct.pack("<I", 32) + _EPB, 1, 1),
])
def test_short_pcapng_blocks_are_corrupt(tmp_path: Path, data: bytes, kept: int, corrupt: int) -> None:
    path = tmp_path / "short.pcapng"
    path.write_bytes(data)
    segs, stats = read_capture(path)
    assert (len(segs), stats.rejected["corrupt"]) == (kept, corrupt)
    for step in (1, 3, 5):  # stream mode, the cut at every chunk boundary
        parser, n = StreamParser(), 0
        for i in range(0, len(data), step):
            n += len(parser.feed(data[i:i + step]))
        parser.close()
        assert (n, parser.stats.rejected["corrupt"]) == (kept, corrupt)


def test_pcapng_option_overrunning_its_block(tmp_path: Path) -> None:
    """An if_tsoffset option whose value lies past the end of the block (and of the file)."""
    idb = struct.pack("<IIHHI", 1, 24, 1, 0, 65535) + struct.pack("<HH", 14, 8) + struct.pack("<I", 24)
    path = tmp_path / "opt.pcapng"
    path.write_bytes(_SHB + idb)
    segs, stats = read_capture(path)
    assert len(segs) == 0 and sum(stats.rejected.values()) == 0


def _packets(n: int, step_ns: int = 1_000_000) -> list[tuple[int, bytes]]:
    return [(T0 + i * step_ns, tcp_packet("10.200.9.10", "10.200.9.20", 40000, 8080, 1000 + i, 5000, PSH | ACK,
                                          b"x" * 10)) for i in range(n)]


_CUT_WHILE_READ = """
import os, sys
from exporters.swift import pcap
path = sys.argv[1]
feed = pcap.StreamParser.feed
def cut_then_feed(self, chunk, *a, **k):
    os.truncate(path, 1000)  # tcpdump -C/-W reusing the name while the file is analysed
    return feed(self, chunk, *a, **k)
pcap.StreamParser.feed = cut_then_feed
segs, stats = pcap.read_capture(path)
print(len(segs), stats.rejected["truncated"])
"""


def test_capture_cut_while_read_is_no_sigbus(tmp_path: Path) -> None:
    path = tmp_path / "race.pcap"
    write_pcap(path, _packets(2000))
    assert path.stat().st_size > 100_000
    r = subprocess.run([sys.executable, "-c", _CUT_WHILE_READ, str(path)], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr[-500:])
    assert r.stdout.split() == ["2000", "0"]  # read before the cut: every record


def test_capture_cut_between_open_and_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is shorter than the size seen at open: the records before the cut are kept."""
    from exporters.swift import pcap

    path = tmp_path / "cut.pcap"
    write_pcap(path, _packets(100))
    size = path.stat().st_size
    real = os.fstat

    def fstat_then_cut(fd: int) -> os.stat_result:
        st = real(fd)
        os.truncate(path, size - 30)
        return st

    monkeypatch.setattr(pcap.os, "fstat", fstat_then_cut)
    segs, stats = read_capture(path)
    assert len(segs) == 99 and stats.rejected["truncated"] == 1


_HUGE_NOT_A_CAPTURE = """
import resource, sys
from exporters.swift import pcap
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
try:
    pcap.read_capture(sys.argv[1])
except pcap.CaptureError as e:
    print("CaptureError", e)
"""


def test_huge_non_capture_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.bin"
    with open(path, "wb") as f:  # sparse: no disk space, but 1 GiB to map or read
        f.write(b"GIF89a")
        f.truncate(1 << 30)
    r = subprocess.run([sys.executable, "-c", _HUGE_NOT_A_CAPTURE, str(path)], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("CaptureError not a pcap"), (r.stdout, r.stderr[-500:])


@pytest.mark.parametrize("bad_ts", [0xF0000000 * 10**9, 0, T0 - 3 * 86_400 * 10**9])
def test_packet_stamped_far_away_is_bad_timestamp(tmp_path: Path, bad_ts: int) -> None:
    pkts = _packets(50)
    pkts[5] = (bad_ts, pkts[5][1])  # e.g. year 2097, among packets of 2026
    path = tmp_path / "fut.pcap"
    write_pcap(path, pkts)
    segs, stats = read_capture(path)
    assert len(segs) == 49 and stats.segments == 49 and stats.packets == 50
    assert stats.rejected["bad_timestamp"] == 1
    assert stats.rejected["clock_backwards"] == 0  # the good packets after it are not "backwards"
    assert int(segs.ts.max()) < T0 + 86_400 * 10**9 and int(segs.seq[5]) == 1006


def test_capture_spanning_days_keeps_every_packet(tmp_path: Path) -> None:
    path = tmp_path / "days.pcap"
    write_pcap(path, _packets(100, step_ns=3600 * 10**9))  # one packet an hour for 4 days
    segs, stats = read_capture(path)
    assert len(segs) == 100 and not stats.rejected


def test_outliers_on_both_sides() -> None:
    from exporters.swift.pcap import outliers

    day = 86_400 * 10**9
    ts = np.array([5, T0, T0 + 1, T0 + 2 * day // 3, T0 + 4 * day // 3, T0 + 10 * day], dtype=np.int64)
    assert outliers(ts).tolist() == [True, False, False, False, False, True]  # type: ignore[union-attr]
    assert outliers(ts[1:5]) is None
    # a quiet weekend in a long capture: both sides are more than a few packets, nothing dropped
    weekend = np.concatenate([T0 + np.arange(50), T0 + 3 * day + np.arange(40)]).astype(np.int64)
    assert outliers(weekend) is None
    # a few packets beyond the gap on the side of the larger group are still damage
    assert outliers(np.concatenate([weekend[:50], [T0 + 10 * day]]).astype(np.int64)).tolist() == [False] * 50 + [True]  # type: ignore[union-attr]


# -- roles ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,message", [
    ('{"nodes": {"c": {"addresses": ["300.1.1.1"]}}}', "'300.1.1.1' is not an IPv4 address"),
    ('{"nodes": {"c": {"addresses": ["-1.2.3.4"]}}}', "'-1.2.3.4' is not an IPv4 address"),
    ('{"nodes": {"c": {"addresses": [5]}}}', "5 is not an IPv4 address"),
    ('{"nodes": {"c": {"addresses": "10.0.0.1"}}}', "addresses must be a list"),
    ('{"nodes": {"c": [1]}}', "node c: a mapping"),
    ('{"nodes": {"c": {"addresses": ["10.0.0.1"]}}, "services": ["x"]}', "must be mappings"),
    ('{"services": {"10.200.9.20:-1": "proxy"}}', "port '-1' is not in 1..65535"),
    ('{"services": {"10.200.9.20:99999999": "proxy"}}', "port '99999999' is not in 1..65535"),
    ('{"services": {"10.200.9.20:0": "proxy"}}', "not in 1..65535"),
    ('{"services": {"10.200.9.20:http": "proxy"}}', "port 'http' is not a number"),
    ('{"client_role": [1]}', "client_role"),
    ('{"nodes": [{"node": "a", "addresses": 5}]}', "node a: addresses must be a list"),
    ('{"nodes": [{"node": "a", "address": "10.0.0.1", "services": [6200]}]}', "node a: services must map"),
    ('{"nodes": [{"node": "a", "address": "10.0.0.1", "services": {"object": 70000}}]}', "not in 1..65535"),
    ("[" * 5000 + "]" * 5000, "nested too deeply"),
    ("nodes:\n  c: {addresses: [10.0.0.1]}\n# caf\xe9\n", "not a text (UTF-8) file"),
])
def test_bad_mapping_is_one_line_role_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "roles.yml"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(RoleError, match=re.escape(message)) as e:
        load_roles(mapping=path)
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


@pytest.mark.parametrize("content,message", [
    (b"[DEFAULT]\nbind_ip = 10.0.0.1\nbind_port = abc\n", "port 'abc' is not a number"),
    (b"[DEFAULT]\nbind_ip = 10.0.0.1\nbind_port = 65536\n", "not in 1..65535"),
    (b"[DEFAULT]\nbind_ip = banana\n", "'banana' is not an IPv4 address"),
    (b"[DEFAULT]\nbind_ip = 10.0.0.1\n# \xff\xfe\n", "not a text"),
    (b"bind_ip = 10.0.0.1\n", "no section headers"),
])
def test_bad_proxy_config_is_one_line_role_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "proxy-server.conf"
    path.write_bytes(content)
    with pytest.raises(RoleError, match=re.escape(message)):
        load_roles(proxy_config=path)


def test_missing_proxy_config_says_so(tmp_path: Path) -> None:
    with pytest.raises(RoleError, match="No such file"):
        load_roles(proxy_config=tmp_path / "nonexistent.conf")


def _ring(path: Path, meta: object) -> None:
    raw = json.dumps(meta).encode()
    with gzip.open(path, "wb") as f:
        f.write(struct.pack("!4sHI", b"R1NG", 1, len(raw)) + raw)


@pytest.mark.parametrize("meta,message", [
    ({"devs": [{"id": 3, "ip": "banana", "port": 6200}]}, "device 3: 'banana' is not an IPv4 address"),
    ({"devs": [{"id": 3, "ip": "10.0.0.1", "port": "x"}]}, "device 3: port 'x' is not a number"),
    ([1, 2], "no device list"),
    ({"devs": [5]}, "no device list"),
])
def test_bad_ring_device_is_one_line_role_error(tmp_path: Path, meta: object, message: str) -> None:
    _ring(tmp_path / "object.ring.gz", meta)
    with pytest.raises(RoleError, match=re.escape(message)):
        load_roles(swift_dir=tmp_path)


def test_ring_ipv6_devices_are_skipped(tmp_path: Path) -> None:
    _ring(tmp_path / "object.ring.gz", {"devs": [{"id": 0, "ip": "fd00::1", "port": 6200},
                                                 {"id": 1, "ip": "10.0.0.1", "port": 6200}]})
    assert list(load_roles(swift_dir=tmp_path).describe()["services"]) == ["10.0.0.1:6200"]


# -- analyze / diagram options ----------------------------------------------------------------------

@pytest.fixture()
def one_capture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = tmp_path / "c.pcap"
    write_pcap(path, _packets(5))

    def no_analysis(*a: object, **k: object) -> None:
        raise AssertionError("the options are checked before the analysis")

    monkeypatch.setattr("exporters.swift.cli._analyze", no_analysis)
    return f"--capture=client={path}"


@pytest.mark.parametrize("window", ["nan,inf", "1e308,1e309", "5,2", "3,3", "-1,5", "inf,1"])
def test_diagram_bad_window_is_one_line(one_capture: str, tmp_path: Path, capsys, window: str) -> None:
    assert main(["diagram", one_capture, f"--out={tmp_path / 'd.png'}", f"--window={window}"]) == 1
    err = capsys.readouterr().err
    assert "--window" in err and "START < END" in err and err.count("\n") == 1


@pytest.mark.parametrize("cmd,flag", [("diagram", "--out"), ("analyze", "--json")])
def test_output_in_missing_directory_fails_before_analysis(one_capture: str, tmp_path: Path, capsys,
                                                           cmd: str, flag: str) -> None:
    out = tmp_path / "nonexistent" / "x.png"
    assert main([cmd, one_capture, f"{flag}={out}", *(["--trans-id=tx"] if cmd == "diagram" else [])]) == 1
    err = capsys.readouterr().err
    assert f"{flag} {out}: no such directory" in err and err.count("\n") == 1


def test_capture_that_is_not_a_regular_file(tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, message in ((fifo, "not a regular file"), (tmp_path, "not a regular file"),
                          (Path("/dev/null"), "not a regular file"), (tmp_path / "nope", "no such file")):
        assert main(["analyze", f"--capture=client={path}"]) == 1
        assert message in capsys.readouterr().err
