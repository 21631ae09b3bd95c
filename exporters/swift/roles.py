"""Which node and which Swift role an address and port belong to.

Sources, merged in this order (later ones win):

1. Swift's rings (``account.ring.gz``, ``container.ring.gz``, ``object.ring.gz`` or
   ``object-N.ring.gz`` in a swift directory): every device's ``ip:port`` (and its replication
   address) serves that ring's role. Read here directly (gzip + ``R1NG`` + JSON header; the
   legacy pickled format is refused, not unpickled): Debian's swift package is not importable
   from this project's virtualenv, and only the device list is needed.
2. The proxy's configuration (``proxy-server.conf``): ``bind_ip``/``bind_port`` of
   ``[DEFAULT]`` serve the ``proxy`` role (port 8080 when unset).
3. A mapping file (YAML), the only source that names nodes (capture files) and clocks::

       nodes:                       # node name -> its addresses; `host` groups nodes sharing a clock
         client:  {addresses: [10.200.0.2], host: machine1}
         proxy:   {addresses: [10.200.0.3], host: machine1}
         storage: {addresses: [10.200.0.4], host: machine2}
       services:                    # ip:port -> role (rings and proxy config fill this too)
         10.200.0.3:8080: proxy
         10.200.0.4:6202: account
       client_role: client          # role of an address that serves nothing known (default: node name)

An endpoint's role: the service role of ``ip:port`` when known; otherwise the role of the
node that owns the address (``client_role`` for a node that serves nothing, ``proxy`` for the
proxy's own connections to storage servers, ``storage`` for a storage server's own calls, e.g.
an object server's container updates); otherwise ``other``. Roles are a bounded set
(``ROLES`` plus node names from the configuration), fit for labels.
"""

from __future__ import annotations

import configparser
import gzip
import ipaddress
import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporters.swift.pcap import ip_str
from promreflex.errors import UserError

ROLES = ("client", "proxy", "account", "container", "object", "storage", "other")
_RING = re.compile(r"^(account|container|object(?:-\d+)?)\.ring\.gz$")


class RoleError(UserError):
    """A ring, proxy configuration or mapping file that cannot be read; one line naming it."""


def parse_ip(text: Any) -> int:
    """A dotted IPv4 address as an int; RoleError for anything else (a number, ``300.1.1.1``)."""
    if not isinstance(text, str):
        raise RoleError(f"{text!r} is not an IPv4 address (a string like 10.0.0.1 is expected)")
    try:
        return int(ipaddress.IPv4Address(text.strip()))
    except ValueError:
        raise RoleError(f"{text!r} is not an IPv4 address") from None


def parse_port(value: Any) -> int:
    """A TCP port 1..65535 (an int or its decimal string); RoleError for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise RoleError(f"port {value!r} is not a number")
    try:
        port = int(value)
    except ValueError:
        raise RoleError(f"port {value!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise RoleError(f"port {value!r} is not in 1..65535")
    return port


def read_ring_devices(path: str | Path) -> list[dict[str, Any]]:
    """The device list of a Swift ring file (format 1: gzip, ``R1NG``, u16 version, u32 JSON length)."""
    try:
        with gzip.open(path, "rb") as f:
            head = f.read(6)
            if len(head) < 6 or head[:4] != b"R1NG":
                raise RoleError(f"{path}: not a Swift ring (format 1) file")
            (version,) = struct.unpack("!H", head[4:])
            if version != 1:
                raise RoleError(f"{path}: ring format version {version} is not supported (1 is)")
            (jlen,) = struct.unpack("!I", f.read(4))
            meta = json.loads(f.read(jlen))
    except (OSError, EOFError, ValueError, struct.error) as e:
        raise RoleError(f"{path}: cannot read the ring: {e}") from e
    except RecursionError:
        raise RoleError(f"{path}: cannot read the ring: its JSON header is nested too deeply") from None
    devs = meta.get("devs") if isinstance(meta, dict) else None
    if not isinstance(devs, list) or not all(isinstance(d, dict) for d in devs if d):
        raise RoleError(f"{path}: not a Swift ring (no device list in its header)")
    return [d for d in devs if d]


@dataclass
class Node:
    name: str
    addresses: list[int] = field(default_factory=list)
    host: str | None = None  # nodes with the same host share a clock
    guessed: bool = False  # addresses inferred from a capture, with a tie


@dataclass
class RoleMap:
    services: dict[tuple[int, int], str] = field(default_factory=dict)  # (ip, port) -> role
    nodes: dict[str, Node] = field(default_factory=dict)
    client_role: str | None = "client"

    # -- building -------------------------------------------------------------------------------
    def add_service(self, ip: str, port: int | str, role: str) -> None:
        """RoleError for an address that is not IPv4 or a port out of 1..65535."""
        self.__dict__.pop("_role_cache", None)
        self.services[(parse_ip(ip), parse_port(port))] = role

    def add_swift_dir(self, swift_dir: str | Path) -> None:
        d = Path(swift_dir)
        rings = sorted(p for p in d.glob("*.ring.gz") if _RING.match(p.name))
        if not rings and not (d / "proxy-server.conf").exists():
            raise RoleError(f"{d}: no ring (*.ring.gz) and no proxy-server.conf")
        for ring in rings:
            role = ring.name.split(".")[0].split("-")[0]
            for dev in read_ring_devices(ring):
                for ip_key, port_key in (("ip", "port"), ("replication_ip", "replication_port")):
                    if dev.get(ip_key) and dev.get(port_key):
                        if isinstance(dev[ip_key], str) and ":" in dev[ip_key]:
                            continue  # IPv6: captures are decoded for IPv4 only
                        try:
                            self.add_service(dev[ip_key], dev[port_key], role)
                        except RoleError as e:
                            raise RoleError(f"{ring}: device {dev.get('id', '?')}: {e}") from None
        if (d / "proxy-server.conf").exists():
            self.add_proxy_config(d / "proxy-server.conf")

    def add_proxy_config(self, path: str | Path) -> None:
        cp = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            with open(path, encoding="utf-8") as f:  # (ConfigParser.read skips a missing file)
                cp.read_file(f)
        except OSError as e:
            raise RoleError(f"{path}: cannot read the proxy configuration: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise RoleError(f"{path}: not a text (UTF-8) configuration file") from None
        except configparser.Error as e:
            raise RoleError(f"{path}: {e}") from e
        ip = cp.get("DEFAULT", "bind_ip", fallback="0.0.0.0")
        port = cp.get("DEFAULT", "bind_port", fallback="8080")
        if ip in ("0.0.0.0", ""):
            raise RoleError(f"{path}: bind_ip is {ip or 'unset'}; name the proxy's address in the mapping file")
        try:
            self.add_service(ip, port, "proxy")
        except RoleError as e:
            raise RoleError(f"{path}: bind_ip/bind_port: {e}") from None

    def add_mapping(self, path: str | Path) -> None:
        import yaml  # only for mapping files (keeps the decoder's start-up small)

        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise RoleError(f"{path}: cannot read the mapping file: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise RoleError(f"{path}: not a text (UTF-8) file") from None
        except yaml.YAMLError as e:
            raise RoleError(f"{path}: {e}") from e
        except RecursionError:
            raise RoleError(f"{path}: nested too deeply to be a mapping file") from None
        self.add_mapping_dict(data or {}, str(path))

    def add_mapping_dict(self, data: dict[str, Any], source: str = "mapping") -> None:
        self.__dict__.pop("_role_cache", None)
        if not isinstance(data, dict):
            raise RoleError(f"{source}: a mapping with nodes/services is expected")
        try:
            if isinstance(data.get("nodes"), list):
                data = _from_lab(data)
            nodes, services = data.get("nodes") or {}, data.get("services") or {}
            if not isinstance(nodes, dict) or not isinstance(services, dict):
                raise RoleError("nodes and services must be mappings (name: {addresses: [...]}, ip:port: role)")
            for name, spec in nodes.items():
                spec = spec or {}
                if not isinstance(spec, dict):
                    raise RoleError(f"node {name}: a mapping with addresses (and host) is expected")
                addrs = spec.get("addresses") or []
                if not isinstance(addrs, list):
                    raise RoleError(f"node {name}: addresses must be a list of IPv4 addresses")
                host = spec.get("host")
                self.nodes[str(name)] = Node(str(name), [parse_ip(a) for a in addrs],
                                             None if host is None else str(host))
            for key, role in services.items():
                ip, _, port = str(key).rpartition(":")
                self.add_service(ip, port, str(role))
            if "client_role" in data:
                role = data["client_role"]
                if role is not None and not isinstance(role, str):
                    raise RoleError(f"client_role {role!r} is not a name")
                self.client_role = role
        except RoleError as e:
            raise RoleError(f"{source}: {e}") from None
        except (ValueError, TypeError, AttributeError, RecursionError) as e:
            raise RoleError(f"{source}: {e}") from e

    def add_node(self, node: Node) -> None:
        self.nodes[node.name] = node
        self.__dict__.pop("_role_cache", None)

    # -- lookups --------------------------------------------------------------------------------
    def node_of(self, ip: int) -> str | None:
        for node in self.nodes.values():
            if ip in node.addresses:
                return node.name
        return None

    def service_ports(self) -> set[int]:
        return {port for _, port in self.services}

    def endpoint_role(self, ip: int, port: int) -> str:
        key = (int(ip), int(port))
        cache = self.__dict__.setdefault("_role_cache", {})
        if len(cache) > 100_000:
            cache.clear()
        if key not in cache:
            cache[key] = self._endpoint_role(*key)
        return str(cache[key])

    def _endpoint_role(self, ip: int, port: int) -> str:
        role = self.services.get((int(ip), int(port)))
        if role is not None:
            return role
        node = self.node_of(int(ip))
        # What the address's node serves, on any of its addresses (a proxy with a front and a
        # back interface calls the storage servers from the back one).
        own = set(self.nodes[node].addresses) if node is not None else {int(ip)}
        roles_of_node = {r for (a, _), r in self.services.items() if a in own}
        if roles_of_node == {"proxy"}:
            return "proxy"  # the proxy's own outgoing connections (to storage servers)
        if node is not None and not roles_of_node:
            return self.client_role or node
        if roles_of_node:
            return "proxy" if "proxy" in roles_of_node else "storage"  # a storage server's own calls
        return "other"

    def same_clock(self, a: str, b: str) -> bool:
        na, nb = self.nodes.get(a), self.nodes.get(b)
        return bool(na and nb and na.host is not None and na.host == nb.host)

    def describe(self) -> dict[str, Any]:
        return {
            "services": {f"{ip_str(ip)}:{port}": role for (ip, port), role in sorted(self.services.items())},
            "nodes": {n.name: {"addresses": [ip_str(a) for a in n.addresses], "host": n.host}
                      for n in self.nodes.values()},
        }


def _from_lab(data: dict[str, Any]) -> dict[str, Any]:
    """The ``roles.json`` of ``promreflex swift-lab`` (a list of nodes with their address and
    services; ``clock: shared ...`` when every namespace is on one machine) as a mapping."""
    shared = str(data.get("clock", "")).startswith("shared")
    nodes: dict[str, Any] = {}
    services: dict[str, str] = {}
    for item in data["nodes"]:
        if not isinstance(item, dict) or "node" not in item:
            raise RoleError("each entry of nodes needs a node name")
        addrs = [item["address"]] if item.get("address") else item.get("addresses") or []
        if not isinstance(addrs, list):
            raise RoleError(f"node {item['node']}: addresses must be a list of IPv4 addresses")
        served = item.get("services") or {}
        if not isinstance(served, dict):
            raise RoleError(f"node {item['node']}: services must map a role to its port (object: 6200)")
        nodes[str(item["node"])] = {"addresses": addrs, "host": "shared" if shared else item.get("host")}
        for role, port in served.items():
            for a in addrs:
                services[f"{a}:{port}"] = role
    return {"nodes": nodes, "services": services}


def load_roles(mapping: str | Path | None = None, swift_dir: str | Path | None = None,
               proxy_config: str | Path | None = None) -> RoleMap:
    roles = RoleMap()
    if swift_dir is not None:
        roles.add_swift_dir(swift_dir)
    if proxy_config is not None:
        roles.add_proxy_config(proxy_config)
    if mapping is not None:
        roles.add_mapping(mapping)
    return roles
