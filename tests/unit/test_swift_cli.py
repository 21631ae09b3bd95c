"""``promreflex swift-timing analyze|diagram|serve`` (through ``python -m exporters.swift``'s main)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.swift.cli import main
from exporters.swift.synth import NODES, SynthNet, roles_mapping, swift_put

T0 = 1_795_448_405_000_000_000


@pytest.fixture()
def capture_set(tmp_path: Path) -> tuple[list[str], Path]:
    net = SynthNet(dict(NODES))
    t = T0
    for i in range(3):
        t = swift_put(net, t, f"tx{i}") + 10_000_000
    paths = net.write(tmp_path)
    roles = tmp_path / "roles.json"
    roles.write_text(json.dumps(roles_mapping()))
    args = [f"--capture={n}={p}" for n, p in paths.items()] + [f"--roles={roles}"]
    return args, tmp_path


def test_analyze_json(capture_set, capsys) -> None:
    args, tmp = capture_set
    assert main(["analyze", *args, f"--json={tmp / 'out.json'}"]) == 0
    s = json.loads((tmp / "out.json").read_text())
    assert s["processing_by_role"]["object"]["count"] == 3
    assert s["joins"]["trans_id"] == 9 and s["matching"]["unmatched_egress"] == 0


def test_analyze_metrics(capture_set, capsys) -> None:
    args, _ = capture_set
    assert main(["analyze", *args, "--metrics"]) == 0
    out = capsys.readouterr().out
    assert 'promreflex_swift_node_processing_seconds_count{node="storage",role="object"} 3.0' in out


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_diagram_of_one_request(capture_set, capsys, suffix: str) -> None:
    args, tmp = capture_set
    out = tmp / f"req.{suffix}"
    assert main(["diagram", *args, f"--out={out}", "--trans-id=tx1"]) == 0
    assert out.stat().st_size > 5000
    assert "segments" in capsys.readouterr().out
    head = out.read_bytes()[:8]
    assert head.startswith(b"\x89PNG") if suffix == "png" else b"<?xml" in head or b"<svg" in out.read_bytes()[:400]


def test_diagram_of_a_window(capture_set, capsys) -> None:
    args, tmp = capture_set
    lo = T0 / 1e9
    assert main(["diagram", *args, f"--out={tmp / 'w.png'}", f"--window={lo},{lo + 1}"]) == 0
    assert (tmp / "w.png").exists()


@pytest.mark.parametrize("extra,message", [
    (["--trans-id=nope"], "no request with transaction id"),
    (["--request-index=99"], "--request-index 99"),
    (["--window=a,b"], "START,END"),
])
def test_diagram_bad_selection_is_one_line(capture_set, capsys, extra, message) -> None:
    args, tmp = capture_set
    assert main(["diagram", *args, f"--out={tmp / 'x.png'}", *extra]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_captures_are_one_line_errors(tmp_path: Path, capsys) -> None:
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"GET / HTTP/1.1\r\n\r\n")
    assert main(["analyze", f"--capture=a={junk}"]) == 1
    assert "not a pcap or pcapng capture" in capsys.readouterr().err
    assert main(["analyze", f"--capture=a={tmp_path / 'missing.pcap'}"]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["analyze"]) == 1
    assert "at least one --capture" in capsys.readouterr().err


def test_serve_refuses_public_address_without_token(capture_set, capsys) -> None:
    args, _ = capture_set
    assert main(["serve", *args, "--web.listen-address=0.0.0.0:9999"]) == 1
    assert "--web.token-file" in capsys.readouterr().err
    assert main(["serve", *args, "--live=proxy=eth0"]) == 1
    assert "either --capture" in capsys.readouterr().err


def test_the_capability_brings_the_subcommands(capture_set, capsys) -> None:
    """Through the core CLI with the manifest (what the entry point does once installed)."""
    from exporters.swift.manifest import CAPABILITY
    from promreflex.cli import main as promreflex_main

    args, tmp = capture_set
    assert promreflex_main(["swift-timing", "analyze", *args, f"--json={tmp / 'o.json'}"], capabilities=[CAPABILITY]) == 0
    assert json.loads((tmp / "o.json").read_text())["joins"]["trans_id"] == 9
    with pytest.raises(SystemExit):
        promreflex_main(["swift-lab", "--help"], capabilities=[CAPABILITY])
    assert "swift-lab" in capsys.readouterr().out


def test_a_rotated_capture_is_given_as_several_files_of_one_node(tmp_path: Path, capsys) -> None:
    """tcpdump -C/-G writes a node's capture in several files: each --capture of the node is
    one of them, read in the order of their packets (given in any order), the same breakdown as
    the unrotated capture. The same file twice is refused; a file joined with cat is said."""
    from exporters.swift.synth import write_pcap

    net = SynthNet(dict(NODES))
    t = T0
    for i in range(4):
        t = swift_put(net, t, f"tx{i}") + 10_000_000
    (tmp_path / "whole").mkdir()
    whole = net.write(tmp_path / "whole")
    roles = tmp_path / "roles.json"
    roles.write_text(json.dumps(roles_mapping()))
    args = [f"--roles={roles}"]
    for node, recs in net.captures.items():
        half = len(recs) // 2
        for k, part in enumerate((recs[:half], recs[half:])):
            write_pcap(tmp_path / f"{node}.pcap{k or ''}", [(stamp, frame) for _, stamp, frame in part])
        args += [f"--capture={node}={tmp_path / f'{node}.pcap1'}", f"--capture={node}={tmp_path / f'{node}.pcap'}"]
    assert main(["analyze", *args, f"--json={tmp_path / 'rot.json'}"]) == 0
    assert main(["analyze", f"--roles={roles}", *(f"--capture={n}={p}" for n, p in whole.items()),
                 f"--json={tmp_path / 'whole.json'}"]) == 0
    rot, one = (json.loads((tmp_path / f"{x}.json").read_text()) for x in ("rot", "whole"))
    for key in ("processing_by_role", "joins", "matching", "hops"):
        assert rot[key] == one[key], key
    assert rot["processing_by_role"]["object"]["count"] == 4
    capsys.readouterr()
    assert main(["analyze", f"--roles={roles}", f"--capture=proxy={tmp_path / 'proxy.pcap'}",
                 f"--capture=proxy={tmp_path / 'proxy.pcap'}"]) == 1  # (a user error: exit 1)
    assert "given twice for node proxy" in capsys.readouterr().err
    cat = tmp_path / "proxy.cat.pcap"
    cat.write_bytes((tmp_path / "proxy.pcap").read_bytes() + (tmp_path / "proxy.pcap1").read_bytes())
    assert main(["analyze", f"--roles={roles}", f"--capture=proxy={cat}", f"--capture=client={whole['client']}"]) == 0
    assert "mergecap" in capsys.readouterr().err


@pytest.mark.parametrize("offset_ns,said", [(0, False), (2_000_000, True), (-172_800 * 10**9, True)])
def test_a_shared_clock_the_captures_contradict_is_said(tmp_path: Path, capsys, offset_ns: int, said: bool) -> None:
    """Roles that put two nodes on one host (one clock) while their captures run 2 ms (or two
    days) apart: the transits are off by that much; the analysis says so (it was silent)."""
    net = SynthNet(dict(NODES), clock_offset={"storage": offset_ns})
    t = T0
    for i in range(20):
        t = swift_put(net, t, f"tx{i}") + 10_000_000
    paths = net.write(tmp_path)
    roles = tmp_path / "roles.json"
    roles.write_text(json.dumps(roles_mapping(shared_clock=True)))
    assert main(["analyze", *(f"--capture={n}={p}" for n, p in paths.items()), f"--roles={roles}"]) == 0
    err = capsys.readouterr().err
    assert ("one host (one clock) by the roles" in err and "give each its own host" in err) is said, err
