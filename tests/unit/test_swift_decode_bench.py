"""bench/swift_decode: the field check against tshark and the summary it writes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bench.swift_decode.__main__ import check_fields, write
from exporters.swift.synth import NODES, SynthNet, swift_put

SUMMARY = {
    "packets": 1000, "repeats": 3, "captures": {"a.pcap": 600, "b.pcap": 400}, "date": "2026-11-23 16:00 UTC",
    "cpu_seconds_median": {"tshark": 0.03, "tshark-lean": 0.025, "ours-match": 0.002, "ours-full": 0.004},
    "packets_per_cpu_second": {"tshark": 33333, "tshark-lean": 40000, "ours-match": 500000, "ours-full": 250000},
    "ours_work_only_packets_per_cpu_second": {"ours-match": 900000, "ours-full": 300000},
    "ratio_vs_tshark": {"ours-match": 15.0, "ours-full": 7.5},
    "ratio_vs_tshark_lean": {"ours-match": 12.5, "ours-full": 6.2},
    "conditions": {"cores": 2, "seconds": 3.0, "cpu_busy_pct": 50.0, "cpu_steal_pct": 0.0, "cpu_iowait_pct": 0.0,
                   "load1_start": 1.0, "load1_end": 1.0, "load1_max": 1.0, "groups": {}},
    "tshark_version": "TShark 4.0", "command": "python -m bench.swift_decode", "captures_made_by": "a test",
}


def test_summary_files(tmp_path: Path) -> None:
    write(SUMMARY, tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert "| ours-match | 0.002 | 500,000 | 15.0x | 12.5x |" in md
    assert json.loads((tmp_path / "summary.json").read_text())["ratio_vs_tshark"]["ours-match"] == 15.0
    assert (tmp_path / "speed.png").stat().st_size > 5000


# Skipped only outside CI (under CI=true a missing tshark fails: scripts/install-system.sh installs it).
@pytest.mark.skipif(shutil.which("tshark") is None and os.environ.get("CI") != "true", reason="tshark not installed")
def test_our_fields_equal_tsharks(tmp_path: Path) -> None:
    net = SynthNet(dict(NODES))
    swift_put(net, 1_795_448_405_000_000_000, "tx1", body=b"z" * 9000)
    paths = net.write(tmp_path)
    checked = check_fields(sorted(paths.values()))
    assert checked["proxy.pcap"]["tcp"] == checked["proxy.pcap"]["packets"] > 0


def test_hostile_memory_captures_decode_as_described(tmp_path):
    """bench.swift_decode.hostile_memory: its ACK capture is what it says (every record one
    distinct pure-ACK segment, none rejected), and a cut-down zeros capture is only records too
    short for headers: else its memory figures would be about something else."""
    from bench.swift_decode import hostile_memory as hm
    from exporters.swift.analyze import analyze

    acks = tmp_path / "acks.pcap"
    assert hm.write_acks(acks, 3000) == 3000 and acks.stat().st_size == 24 + 3000 * 70
    zeros = tmp_path / "zeros.pcap"
    zeros.write_bytes(acks.read_bytes()[:24] + b"\0" * 16 * 500)
    summary = analyze({"a": acks, "z": zeros}).summary()
    assert summary["read"]["a"] == {"packets": 3000, "segments": 3000, "snapped": 0, "duplicate": 0, "rejected": {}}
    assert summary["read"]["z"]["packets"] == 500 and summary["read"]["z"]["rejected"] == {"snaplen_headers": 500}
