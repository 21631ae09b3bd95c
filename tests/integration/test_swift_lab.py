"""``promreflex swift-lab``: a real Swift (Debian's packages) in network namespaces.

Up, a verified PUT/GET through the proxy from the client namespace, a non-empty nanosecond
capture on every node that holds that node's own Swift traffic, then down leaves no namespace,
no process and no state behind; down is idempotent and also cleans up after a crashed ``up``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import dpkt
import pytest

from exporters.swift.lab import (
    PROXY_PORT,
    SERVICES,
    LabConfig,
    LabState,
    SwiftLab,
    main,
    netns_list,
    prefix_for,
    requirements_missing,
)
from promreflex.proc import pid_alive

_missing = requirements_missing()
if _missing and os.environ.get("CI") == "true":
    raise RuntimeError(f"swift-lab integration tests cannot run under CI=true: missing {', '.join(_missing)}")

pytestmark = [pytest.mark.integration, pytest.mark.skipif(bool(_missing) and os.environ.get("CI") != "true", reason=f"needs {', '.join(_missing)}")]


NANO_MAGIC = bytes.fromhex("4d3cb2a1")  # pcap with nanosecond timestamps, little-endian


def _tcp_packets(path: Path) -> list[tuple[str, int, str, int]]:
    """(src, sport, dst, dport) of every TCP packet in a pcap; asserts nanosecond timestamps."""
    out = []
    with open(path, "rb") as f:
        assert f.read(4) in (NANO_MAGIC, NANO_MAGIC[::-1]), f"{path} is not a nanosecond pcap"
        f.seek(0)
        for _ts, buf in dpkt.pcap.Reader(f):
            ip = dpkt.ethernet.Ethernet(buf).data
            if isinstance(ip, dpkt.ip.IP) and isinstance(ip.data, dpkt.tcp.TCP):
                out.append((dpkt.utils.inet_to_str(ip.src), ip.data.sport, dpkt.utils.inet_to_str(ip.dst),
                            ip.data.dport))
    return out


def _ours(prefix: str) -> list[str]:
    return [ns for ns in netns_list() if ns.startswith(prefix + "-")]


def test_up_put_get_capture_on_every_node_then_down_leaves_nothing(tmp_path: Path) -> None:
    lab = SwiftLab(LabConfig(lab_dir=tmp_path / "lab", subnet="10.200.141.0/24", storage_nodes=2))
    try:
        state = lab.up(verify=False)
        assert state.ready and len(state.namespaces) == 4 + 1  # client, proxy, s1, s2 + the bridge
        assert sorted(_ours(lab.prefix)) == sorted(state.namespaces)

        # A verified round trip through the proxy, run inside the client namespace.
        out = lab.run_in_client(["-m", "exporters.swift.lab_client", "--auth", lab.auth_url, "--user", "test:tester",
                                 "--key", "testing", "roundtrip", "--container", "it", "--sizes", "1,1024,1048576"],
                                timeout=120, what="round trip")
        result = json.loads(out.strip().splitlines()[-1])
        assert result["ok"] is True
        assert [o["size"] for o in result["objects"]] == [1, 1024, 1048576]
        assert all(o["ok"] and o["put_trans_id"].startswith("tx") for o in result["objects"])

        status = lab.status()
        assert status["up"] is True
        lab.stop_captures()

        by_node = {n.name: n for n in lab.nodes}
        for node in lab.nodes:
            packets = _tcp_packets(lab.capture_path("captures", node.name))
            assert packets, f"no packets captured on {node.name}"
            # Every packet in a node's capture is to or from that node (its own eth0).
            assert all(node.address in (s, d) for s, _, d, _ in packets), node.name
        proxy = by_node["proxy"].address
        client = _tcp_packets(lab.capture_path("captures", "client"))
        assert any(d == proxy and dp == PROXY_PORT for _, _, d, dp in client)
        for s in ("s1", "s2"):
            storage = _tcp_packets(lab.capture_path("captures", s))
            assert any(src == proxy and d == by_node[s].address and dp == SERVICES["object"]
                       for src, _, d, dp in storage), f"no proxy -> object server traffic seen on {s}"

        # Swift's logs carry the transaction ids the client saw.
        proxy_log = (lab.log_dir / "proxy-server.log").read_text()
        assert result["objects"][2]["put_trans_id"] in proxy_log
        pids = [p.pid for p in lab.state.procs] if lab.state else []
        server_pids = [p.pid for p in state.procs if p.kind == "server"]
        assert server_pids
    finally:
        removed = lab.down()
    assert removed
    assert _ours(lab.prefix) == []
    assert not any(pid_alive(pid) for pid in [*pids, *server_pids])
    assert not (lab.dir / "state.json").exists()
    # No interface of ours in the caller's namespace (veths were created inside the namespaces).
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout  # noqa: S607
    assert "v-proxy" not in links and "v-client" not in links
    assert lab.down() == []  # idempotent
    assert main(["status", "--lab.dir", str(lab.dir)]) == 1


def test_down_cleans_up_after_a_crashed_up(tmp_path: Path) -> None:
    lab_dir = tmp_path / "lab"
    lab = SwiftLab(LabConfig(lab_dir=lab_dir, subnet="10.200.142.0/24", storage_nodes=1))
    lab.dir.mkdir(parents=True)
    # An `up` that died after building the network and one process, before finishing.
    lab.state = LabState(lab_dir=str(lab.dir), prefix=lab.prefix, subnet=lab.cfg.subnet)
    try:
        lab._network()
        lab._spawn("sleeper", lab.node("proxy").namespace, ["sleep", "300"], kind="server")
        sleeper = lab.state.procs[0].pid
        # And a namespace the crash left before the state file could name it.
        orphan = f"{prefix_for(lab_dir)}-s9"
        subprocess.run(["ip", "netns", "add", orphan], check=True)  # noqa: S607
        assert pid_alive(sleeper) and orphan in netns_list()
    finally:
        removed = SwiftLab(LabConfig(lab_dir=lab_dir)).down()  # a fresh process knows only the directory
    assert f"namespace {orphan}" in removed
    assert _ours(lab.prefix) == []
    assert not pid_alive(sleeper)
    assert SwiftLab(LabConfig(lab_dir=lab_dir)).down() == []


def test_bad_input_is_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--lab.dir", str(tmp_path), "--subnet", "192.168.1.0/24"]) == 1
    assert main(["up", "--lab.dir", str(tmp_path), "--storage-nodes", "0"]) == 1
    assert main(["up", "--lab.dir", str(tmp_path), "--subnet", "nonsense"]) == 1
    (tmp_path / "state.json").write_text("{not json")
    assert main(["down", "--lab.dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("promreflex: swift-lab: ") for line in err)
    assert "10.200.0.0/16" in err[0] and "1..8" in err[1] and "state file" in err[3]
