"""Roles from Swift's rings, the proxy's configuration, a mapping file and the lab's roles.json."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import pytest

from exporters.swift.pcap import ip_int
from exporters.swift.roles import RoleError, load_roles, read_ring_devices


def _ring(path: Path, devs: list[dict | None], version: int = 1) -> None:
    meta = json.dumps({"devs": devs, "part_shift": 22, "replica_count": 1, "byteorder": "little"}).encode()
    with gzip.open(path, "wb") as f:
        f.write(struct.pack("!4sH", b"R1NG", version) + struct.pack("!I", len(meta)) + meta + b"\x00\x00" * 4)


def _swift_dir(d: Path) -> Path:
    for role, port in (("account", 6202), ("container", 6201), ("object", 6200)):
        _ring(d / f"{role}.ring.gz", [
            {"id": 0, "ip": "10.200.3.31", "port": port, "replication_ip": "10.200.4.31", "replication_port": port + 10},
            None,  # a removed device
            {"id": 2, "ip": "10.200.3.32", "port": port},
        ])
    (d / "proxy-server.conf").write_text("[DEFAULT]\nbind_ip = 10.200.3.20\nbind_port = 8080\nworkers = 1\n"
                                         "[pipeline:main]\npipeline = catch_errors proxy-server\n")
    return d


def test_rings_and_proxy_config(tmp_path: Path) -> None:
    roles = load_roles(swift_dir=_swift_dir(tmp_path))
    assert roles.endpoint_role(ip_int("10.200.3.31"), 6200) == "object"
    assert roles.endpoint_role(ip_int("10.200.3.32"), 6202) == "account"
    assert roles.endpoint_role(ip_int("10.200.4.31"), 6211) == "container"  # replication address
    assert roles.endpoint_role(ip_int("10.200.3.20"), 8080) == "proxy"
    assert roles.endpoint_role(ip_int("10.200.3.20"), 51234) == "proxy"  # the proxy's own calls
    assert roles.endpoint_role(ip_int("10.200.3.31"), 51234) == "storage"  # e.g. a container update
    assert roles.endpoint_role(ip_int("10.200.3.99"), 51234) == "other"


def test_mapping_names_nodes_clients_and_hosts(tmp_path: Path) -> None:
    m = tmp_path / "roles.yml"
    m.write_text("nodes:\n  client: {addresses: [10.200.3.10], host: m1}\n  proxy: {addresses: [10.200.3.20], host: m1}\n"
                 "  storage: {addresses: [10.200.3.31], host: m2}\nservices:\n  10.200.3.31:6200: object\n")
    roles = load_roles(mapping=m, swift_dir=_swift_dir(tmp_path))
    assert roles.endpoint_role(ip_int("10.200.3.10"), 40000) == "client"
    assert roles.same_clock("client", "proxy") and not roles.same_clock("proxy", "storage")
    assert roles.node_of(ip_int("10.200.3.31")) == "storage"


def test_lab_roles_json(tmp_path: Path) -> None:
    lab = {"clock": "shared (all namespaces of one machine)", "nodes": [
        {"node": "client", "role": "client", "address": "10.200.14.10", "services": {}},
        {"node": "proxy", "role": "proxy", "address": "10.200.14.20", "services": {"proxy": 8080}},
        {"node": "s1", "role": "storage", "address": "10.200.14.31",
         "services": {"object": 6200, "container": 6201, "account": 6202}}]}
    p = tmp_path / "roles.json"
    p.write_text(json.dumps(lab))
    roles = load_roles(mapping=p)
    assert roles.endpoint_role(ip_int("10.200.14.31"), 6201) == "container"
    assert roles.same_clock("client", "s1")


@pytest.mark.parametrize("content,message", [
    (b"not gzip", "cannot read the ring"),
    (gzip.compress(b"PICKLE..."), "not a Swift ring"),
])
def test_bad_ring_is_one_line_error(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "object.ring.gz"
    p.write_bytes(content)
    with pytest.raises(RoleError, match=message):
        read_ring_devices(p)


def test_ring_version_2_refused(tmp_path: Path) -> None:
    p = tmp_path / "object.ring.gz"
    _ring(p, [], version=2)
    with pytest.raises(RoleError, match="version 2"):
        read_ring_devices(p)


def test_bad_mapping_and_wildcard_proxy(tmp_path: Path) -> None:
    m = tmp_path / "roles.yml"
    m.write_text("services:\n  nonsense: object\n")
    with pytest.raises(RoleError, match="roles.yml"):
        load_roles(mapping=m)
    c = tmp_path / "proxy-server.conf"
    c.write_text("[DEFAULT]\nbind_port = 8080\n")
    with pytest.raises(RoleError, match="bind_ip"):
        load_roles(proxy_config=c)
    with pytest.raises(RoleError, match="no ring"):
        load_roles(swift_dir=tmp_path / "nothing")


def test_a_node_with_two_addresses_keeps_its_role_on_both() -> None:
    from exporters.swift.roles import RoleMap

    roles = RoleMap()
    roles.add_mapping_dict({"nodes": {"proxy": {"addresses": ["10.200.91.2", "10.200.92.2"]},
                                      "client": {"addresses": ["10.200.91.1"]}},
                            "services": {"10.200.91.2:8080": "proxy"}})
    assert roles.endpoint_role(ip_int("10.200.92.2"), 40000) == "proxy"  # the back interface
    assert roles.endpoint_role(ip_int("10.200.91.1"), 40000) == "client"
