"""``promreflex swift-lab up|down|status``: a real OpenStack Swift split over network namespaces.

The lab is the paper's testbed on one machine (seed 004: client, proxy node, storage nodes):

- a *bridge* namespace holding a Linux bridge, and one namespace per node: ``client``,
  ``proxy`` (proxy-server, tempauth, memcached on the proxy's loopback) and ``s1..sN`` (each
  runs an account, a container and an object server). Each node has one ``eth0``, the peer of a
  veth whose other end is a port of the bridge. Addresses are ``<subnet>.10`` (client),
  ``.20`` (proxy), ``.31``... (storage nodes) of a /24 inside 10.200.0.0/16; they exist only
  inside the lab's namespaces, and no interface is ever created in the caller's namespace.
- Swift from Debian's packages (``/usr/bin/swift-*-server``, 2.30), every file under the lab
  directory: ``swift.conf`` (``swift_dir`` points there), the three rings built with
  ``swift-ring-builder`` (one device per storage node, one zone per node, ``replicas`` copies),
  each server's configuration, its devices, its log.
- a capture on every node's ``eth0``: ``tcpdump -i eth0 -s SNAPLEN --time-stamp-precision=nano
  --immediate-mode -U -w captures/<node>.pcap tcp``. Choices: nanosecond host timestamps (all
  namespaces share the machine's clock, so no offset between captures); ``--immediate-mode`` and
  ``-U`` hand every packet to the file as it comes (without them the kernel delivers packets in
  blocks, up to a second late, and a tcpdump stopped within that second loses them), so a reader
  can follow the files live and a short run is captured whole; the default snaplen of 2048 bytes keeps the Ethernet,
  IP and TCP headers plus the first ~1,980 bytes of payload, enough for a whole HTTP request or
  response head, including ``X-Trans-Id`` (the proxy sends it to every backend and returns it to
  the client), so captures can be joined across the proxy by transaction id; segmentation
  offload is left on (what a real host does), so a capture may hold segments larger than the MTU.
- Swift's logs: each server runs with ``-v`` (log to stderr) into ``logs/<node>-<service>.log``;
  every access line carries the transaction id. ``roles.json`` maps every address and port to
  its node and role (the exporter's address -> role map).
- ``state.json`` records every namespace, process (PID and start time, so a recycled PID is
  never signalled) and file the lab made, written after each step: ``down`` works after a crash
  of ``up`` or of the machine's processes, and is idempotent. Namespaces are named
  ``psw-<hash of the lab directory>-<node>``, so ``down`` also finds namespaces a crash left
  before the state file named them.

The lab needs root (namespaces, tcpdump). Python code that must run *inside* a namespace (the
bench's clients, the verification) runs as ``ip netns exec <ns> <this python> -m ...``.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from promreflex.errors import UserError
from promreflex.proc import Timeout, pid_alive, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
SWIFT_BIN = Path("/usr/bin")
SERVICES = {"object": 6200, "container": 6201, "account": 6202}
PROXY_PORT = 8080
MEMCACHED_PORT = 11211
AUTH_USER, AUTH_KEY = "test:tester", "testing"
DEFAULT_SUBNET = "10.200.14.0/24"
DEFAULT_SNAPLEN = 2048
STATE_FILE = "state.json"
ROLES_FILE = "roles.json"
NODE_IFACE = "eth0"


def default_lab_dir() -> Path:
    """``$XDG_STATE_HOME/promreflex/swift-lab`` when XDG_STATE_HOME is set, else ``.promreflex/swift-lab``."""
    xdg = os.environ.get("XDG_STATE_HOME")
    return Path(xdg) / "promreflex" / "swift-lab" if xdg else Path(".promreflex/swift-lab")


@dataclass(frozen=True)
class LabConfig:
    """What ``up`` builds. ``storage_nodes`` 1..8; ``replicas`` defaults to min(3, nodes)."""

    lab_dir: Path = field(default_factory=default_lab_dir)
    subnet: str = DEFAULT_SUBNET
    storage_nodes: int = 3
    replicas: int | None = None
    snaplen: int = DEFAULT_SNAPLEN
    proxy_workers: int = 1
    storage_workers: int = 1

    def checked(self) -> LabConfig:
        try:
            net = ipaddress.ip_network(self.subnet, strict=True)
        except ValueError as e:
            raise UserError(f"swift-lab: --subnet {self.subnet!r} is not a network: {e}") from None
        if net.prefixlen != 24 or not net.subnet_of(ipaddress.ip_network("10.200.0.0/16")):  # type: ignore[arg-type]
            raise UserError(f"swift-lab: --subnet must be a /24 inside 10.200.0.0/16, got {self.subnet}")
        if not 1 <= self.storage_nodes <= 8:
            raise UserError(f"swift-lab: --storage-nodes must be 1..8, got {self.storage_nodes}")
        replicas = self.replicas if self.replicas is not None else min(3, self.storage_nodes)
        if not 1 <= replicas <= self.storage_nodes:
            raise UserError(f"swift-lab: --replicas must be 1..{self.storage_nodes} (one device per node), got {replicas}")
        if not 96 <= self.snaplen <= 262144:
            raise UserError(f"swift-lab: --snaplen must be 96..262144, got {self.snaplen}")
        if not 1 <= self.proxy_workers <= 16 or not 1 <= self.storage_workers <= 16:
            raise UserError("swift-lab: --proxy-workers and --storage-workers must be 1..16")
        return LabConfig(self.lab_dir.resolve(), str(net), self.storage_nodes, replicas, self.snaplen,
                         self.proxy_workers, self.storage_workers)


@dataclass(frozen=True)
class Node:
    name: str  # client, proxy, s1, s2, ...
    role: str  # client, proxy, storage
    address: str
    namespace: str


def prefix_for(lab_dir: Path) -> str:
    """The namespace name prefix of the lab in ``lab_dir`` (stable, short, unique per directory)."""
    return "psw-" + hashlib.sha256(str(lab_dir.resolve()).encode()).hexdigest()[:6]


def plan(cfg: LabConfig) -> list[Node]:
    """The nodes of a lab: client, proxy, then the storage nodes, with their addresses."""
    base = str(ipaddress.ip_network(cfg.subnet).network_address).rsplit(".", 1)[0]
    prefix = prefix_for(cfg.lab_dir)
    nodes = [Node("client", "client", f"{base}.10", f"{prefix}-client"),
             Node("proxy", "proxy", f"{base}.20", f"{prefix}-proxy")]
    nodes += [Node(f"s{i}", "storage", f"{base}.{30 + i}", f"{prefix}-s{i}") for i in range(1, cfg.storage_nodes + 1)]
    return nodes


# -- shell plumbing ----------------------------------------------------------------------------

def _run(argv: Sequence[str], what: str, ok: Sequence[int] = (0,), timeout: float = 60) -> str:
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603
    except FileNotFoundError:
        raise UserError(f"swift-lab: {what}: {argv[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"swift-lab: {what}: {' '.join(argv)} did not finish in {timeout:.0f}s") from None
    if r.returncode not in ok:
        detail = (r.stderr or r.stdout).strip().splitlines()
        raise UserError(f"swift-lab: {what} failed (exit {r.returncode}): {detail[-1] if detail else ' '.join(argv)}")
    return r.stdout


def netns_list() -> list[str]:
    out = _run(["ip", "netns", "list"], "listing namespaces")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_exec(namespace: str, argv: Sequence[str]) -> list[str]:
    """The argv that runs ``argv`` inside ``namespace``."""
    return ["ip", "netns", "exec", namespace, *argv]


def netns_pids(namespace: str) -> list[int]:
    try:
        out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True,  # noqa: S607
                             timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(x) for x in out.split() if x.isdigit()]


def tcp_open(namespace: str, host: str, port: int) -> bool:
    """True when ``host:port`` accepts a TCP connection from inside ``namespace``."""
    code = f"import socket; socket.create_connection(({host!r}, {port}), timeout=1).close()"
    r = subprocess.run(netns_exec(namespace, [sys.executable, "-c", code]), capture_output=True,  # noqa: S603
                       timeout=15, check=False)
    return r.returncode == 0


def requirements_missing() -> list[str]:
    """What this machine lacks to run a lab (root, Swift's servers, tcpdump, memcached, ip)."""
    missing = [] if os.geteuid() == 0 else ["root (network namespaces, tcpdump)"]
    missing += [str(p) for p in (*(SWIFT_BIN / f"swift-{s}-server" for s in (*SERVICES, "proxy")),
                                 SWIFT_BIN / "swift-ring-builder") if not p.exists()]
    missing += [b for b in ("ip", "tc", "tcpdump", "memcached") if shutil.which(b) is None]
    return missing


# -- state -------------------------------------------------------------------------------------

@dataclass
class Proc:
    name: str
    namespace: str
    pid: int
    create_time: float
    argv: list[str]
    log: str
    kind: str = "server"  # server | capture | memcached

    def alive(self) -> bool:
        """Alive and still the process we started (a recycled PID is not ours)."""
        if not pid_alive(self.pid):
            return False
        try:
            return abs(psutil.Process(self.pid).create_time() - self.create_time) < 0.5
        except psutil.Error:
            return False


@dataclass
class LabState:
    lab_dir: str
    prefix: str
    subnet: str = ""
    namespaces: list[str] = field(default_factory=list)
    nodes: list[dict[str, str]] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)
    capture_dir: str = ""
    started_at: float = 0.0
    ready: bool = False
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, lab_dir: Path) -> LabState | None:
        path = lab_dir / STATE_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise UserError(f"swift-lab: state file {path} is unreadable ({e}); remove it after checking "
                            f"`ip netns list` for namespaces named {prefix_for(lab_dir)}-*") from None
        try:
            procs = [Proc(**p) for p in raw.pop("procs", [])]
            return cls(**raw, procs=procs)
        except TypeError as e:
            raise UserError(f"swift-lab: state file {path} is not a lab state ({e})") from None

    def save(self) -> None:
        path = Path(self.lab_dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)


# -- the lab -----------------------------------------------------------------------------------

class SwiftLab:
    """Build, inspect and tear down one lab (one directory). See the module docstring."""

    def __init__(self, cfg: LabConfig | None = None, lab_dir: Path | None = None) -> None:
        if cfg is None:
            cfg = LabConfig(lab_dir=lab_dir or default_lab_dir())
        self.cfg = cfg.checked()
        self.dir = self.cfg.lab_dir
        self.prefix = prefix_for(self.dir)
        self.nodes = plan(self.cfg)
        self.bridge_ns = f"{self.prefix}-br"
        self.state: LabState | None = None

    @classmethod
    def attach(cls, lab_dir: Path | None = None) -> SwiftLab:
        """The lab that is up in ``lab_dir`` (its configuration from the state file), for
        programs that drive a running lab (the bench). :class:`UserError` when none is up."""
        lab_dir = (lab_dir or default_lab_dir()).resolve()
        state = LabState.load(lab_dir)
        if state is None or not state.ready:
            raise UserError(f"swift-lab: no lab is up in {lab_dir}; start one with "
                            f"`promreflex swift-lab up --lab.dir {lab_dir}`")
        c = state.config
        try:
            cfg = LabConfig(lab_dir=lab_dir, subnet=c["subnet"], storage_nodes=int(c["storage_nodes"]),
                            replicas=int(c["replicas"]), snaplen=int(c["snaplen"]),
                            proxy_workers=int(c["proxy_workers"]), storage_workers=int(c["storage_workers"]))
        except (KeyError, ValueError) as e:
            raise UserError(f"swift-lab: state file in {lab_dir} lacks its configuration ({e})") from None
        lab = cls(cfg)
        lab.state = state
        return lab

    # paths
    @property
    def swift_dir(self) -> Path:
        return self.dir / "swift"

    @property
    def log_dir(self) -> Path:
        return self.dir / "logs"

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise UserError(f"swift-lab: no node {name!r}; nodes: {', '.join(n.name for n in self.nodes)}")

    @property
    def storage(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "storage"]

    @property
    def auth_url(self) -> str:
        return f"http://{self.node('proxy').address}:{PROXY_PORT}/auth/v1.0"

    def delay_file(self, node: str) -> Path:
        return self.dir / "nodes" / node / "object-delay-ms"

    # ---- up
    def up(self, verify: bool = True) -> LabState:
        """Build the whole lab; on any failure tear down what was built and raise :class:`UserError`."""
        self._preflight()
        existing = LabState.load(self.dir)
        if existing is not None and (any(p.alive() for p in existing.procs) or
                                     set(existing.namespaces) & set(netns_list())):
            raise UserError(f"swift-lab: a lab is already up in {self.dir} (see `promreflex swift-lab status"
                            f" --lab.dir {self.dir}`); run `promreflex swift-lab down --lab.dir {self.dir}` first")
        if existing is not None or self._leftover_namespaces():
            self.down()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state = LabState(lab_dir=str(self.dir), prefix=self.prefix, subnet=self.cfg.subnet,
                              nodes=[asdict(n) for n in self.nodes], started_at=time.time(),
                              config={k: str(v) for k, v in asdict(self.cfg).items()})
        self.state.save()
        try:
            self._network()
            self._write_swift_files()
            self._start_servers()
            self._wait_ready()
            # After the readiness probes (refused connections), before the first request.
            self.start_captures("captures")
            if verify:
                self.verify()
            self.state.ready = True
            self.state.save()
        except BaseException as e:
            self.down()
            if isinstance(e, UserError):
                raise
            if isinstance(e, Timeout):
                raise UserError(f"swift-lab: {e}; logs in {self.log_dir}") from None
            raise
        return self.state

    def _preflight(self) -> None:
        missing = requirements_missing()
        if missing:
            raise UserError(f"swift-lab: needs {', '.join(missing)} (Debian packages: swift swift-proxy swift-account "
                            "swift-container swift-object memcached tcpdump iproute2)")

    def _leftover_namespaces(self) -> list[str]:
        return [ns for ns in netns_list() if ns.startswith(self.prefix + "-")]

    def _add_namespace(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns], f"creating namespace {ns}")
        assert self.state is not None
        self.state.namespaces.append(ns)
        self.state.save()
        _run(["ip", "-n", ns, "link", "set", "lo", "up"], f"bringing lo up in {ns}")

    def _network(self) -> None:
        self._add_namespace(self.bridge_ns)
        _run(["ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge"], "creating the bridge")
        _run(["ip", "-n", self.bridge_ns, "link", "set", "br0", "up"], "bringing the bridge up")
        for n in self.nodes:
            self._add_namespace(n.namespace)
            port = f"v-{n.name}"
            _run(["ip", "-n", self.bridge_ns, "link", "add", port, "type", "veth", "peer", "name", NODE_IFACE,
                  "netns", n.namespace], f"creating the veth pair of {n.name}")
            _run(["ip", "-n", self.bridge_ns, "link", "set", port, "master", "br0", "up"], f"bridging {n.name}")
            _run(["ip", "-n", n.namespace, "addr", "add", f"{n.address}/24", "dev", NODE_IFACE],
                 f"addressing {n.name}")
            _run(["ip", "-n", n.namespace, "link", "set", NODE_IFACE, "up"], f"bringing {n.name}'s eth0 up")

    def _write_swift_files(self) -> None:
        sd = self.swift_dir
        sd.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        suffix = hashlib.sha256(str(self.dir).encode()).hexdigest()[:16]
        (sd / "swift.conf").write_text(
            "[swift-hash]\n"
            f"swift_hash_path_suffix = {suffix}\n"
            "swift_hash_path_prefix = promreflex\n\n"
            "[storage-policy:0]\nname = Policy-0\ndefault = yes\n")
        pydir = self.dir / "py"
        pydir.mkdir(exist_ok=True)
        shutil.copyfile(Path(__file__).with_name("lab_delay.py"), pydir / "promreflex_swift_delay.py")
        replicas = self.cfg.replicas or 1
        for service, port in SERVICES.items():
            builder = str(sd / f"{service}.builder")
            if Path(builder).exists():
                Path(builder).unlink()
            _run([str(SWIFT_BIN / "swift-ring-builder"), builder, "create", "10", str(replicas), "1"],
                 f"creating the {service} ring")
            for i, n in enumerate(self.storage, start=1):
                _run([str(SWIFT_BIN / "swift-ring-builder"), builder, "add", f"r1z{i}-{n.address}:{port}/d1", "100"],
                     f"adding {n.name} to the {service} ring")
            _run([str(SWIFT_BIN / "swift-ring-builder"), builder, "rebalance"], f"balancing the {service} ring",
                 ok=(0, 1))
        for n in self.storage:
            devices = self.dir / "nodes" / n.name / "srv"
            (devices / "d1").mkdir(parents=True, exist_ok=True)
            for service, port in SERVICES.items():
                pipeline = f"{service}-server"
                extra = ""
                if service == "object":
                    pipeline = "delay object-server"
                    extra = ("[filter:delay]\npaste.filter_factory = promreflex_swift_delay:filter_factory\n"
                             f"delay_file = {self.delay_file(n.name)}\nmethods = PUT,GET\n\n")
                (sd / f"{service}-{n.name}.conf").write_text(
                    "[DEFAULT]\n"
                    f"bind_ip = {n.address}\nbind_port = {port}\nworkers = {self.cfg.storage_workers}\n"
                    f"user = root\nswift_dir = {sd}\ndevices = {devices}\nmount_check = false\n"
                    f"log_name = {service}-{n.name}\nlog_level = INFO\n\n"
                    f"[pipeline:main]\npipeline = {pipeline}\n\n"
                    f"[app:{service}-server]\nuse = egg:swift#{service}\n\n"
                    f"{extra}"
                    f"[{service}-replicator]\n\n[{service}-updater]\n\n[{service}-auditor]\n")
        proxy = self.node("proxy")
        (sd / "proxy-server.conf").write_text(
            "[DEFAULT]\n"
            f"bind_ip = {proxy.address}\nbind_port = {PROXY_PORT}\nworkers = {self.cfg.proxy_workers}\n"
            f"user = root\nswift_dir = {sd}\nlog_name = proxy\nlog_level = INFO\n\n"
            "[pipeline:main]\n"
            "pipeline = catch_errors gatekeeper healthcheck proxy-logging cache tempauth proxy-logging proxy-server\n\n"
            "[app:proxy-server]\nuse = egg:swift#proxy\naccount_autocreate = true\n\n"
            "[filter:catch_errors]\nuse = egg:swift#catch_errors\n\n"
            "[filter:gatekeeper]\nuse = egg:swift#gatekeeper\n\n"
            "[filter:healthcheck]\nuse = egg:swift#healthcheck\n\n"
            "[filter:proxy-logging]\nuse = egg:swift#proxy_logging\n\n"
            f"[filter:cache]\nuse = egg:swift#memcache\nmemcache_servers = 127.0.0.1:{MEMCACHED_PORT}\n\n"
            "[filter:tempauth]\nuse = egg:swift#tempauth\n"
            f"user_{AUTH_USER.replace(':', '_')} = {AUTH_KEY} .admin\n")
        roles = {
            "clock": "shared (all namespaces of one machine read the same clock: no offset between captures)",
            "snaplen": self.cfg.snaplen,
            "nodes": [{"node": n.name, "role": n.role, "address": n.address, "namespace": n.namespace,
                       "interface": NODE_IFACE,
                       "services": ({"proxy": PROXY_PORT} if n.role == "proxy" else
                                    dict(SERVICES) if n.role == "storage" else {})} for n in self.nodes],
            "endpoints": {f"{n.address}:{port}": f"{service}@{n.name}"
                          for n in self.nodes
                          for service, port in ({"proxy": PROXY_PORT} if n.role == "proxy" else
                                                SERVICES if n.role == "storage" else {}).items()},
            "addresses": {n.address: n.name for n in self.nodes},
            "auth": {"url": self.auth_url, "user": AUTH_USER, "key": AUTH_KEY},
            "replicas": replicas,
        }
        (self.dir / ROLES_FILE).write_text(json.dumps(roles, indent=1) + "\n")

    def _spawn(self, name: str, ns: str, argv: list[str], kind: str, env: dict[str, str] | None = None) -> Proc:
        assert self.state is not None
        log = self.log_dir / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab", buffering=0) as out:
            popen = subprocess.Popen(netns_exec(ns, argv), stdout=out, stderr=subprocess.STDOUT,  # noqa: S603
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     env={**os.environ, **(env or {})})
        try:
            created = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            created = 0.0
        proc = Proc(name=name, namespace=ns, pid=popen.pid, create_time=created, argv=argv, log=str(log), kind=kind)
        self.state.procs.append(proc)
        self.state.save()
        return proc

    def capture_path(self, subdir: str, node: str) -> Path:
        return self.dir / subdir / f"{node}.pcap"

    def start_captures(self, subdir: str) -> dict[str, Path]:
        """Start one tcpdump per node writing ``<lab>/<subdir>/<node>.pcap``; wait until each has
        written its file header (the capture is armed). Stops the captures already running."""
        self.stop_captures()
        assert self.state is not None
        (self.dir / subdir).mkdir(parents=True, exist_ok=True)
        paths = {}
        for n in self.nodes:
            path = self.capture_path(subdir, n.name)
            if path.exists():
                path.unlink()
            self._spawn(f"tcpdump-{n.name}", n.namespace,
                        ["tcpdump", "-i", NODE_IFACE, "-s", str(self.cfg.snaplen), "--time-stamp-precision=nano",
                         "--immediate-mode", "-U", "-n", "-w", str(path), "tcp"], kind="capture")
            paths[n.name] = path
        # tcpdump writes the 24-byte pcap header when it opens the file, after the interface is live.
        wait_until(lambda: all(p.exists() and p.stat().st_size >= 24 for p in paths.values()), timeout=20,
                   what="every tcpdump to open its capture file")
        self.state.capture_dir = str(self.dir / subdir)
        self.state.save()
        return paths

    def stop_captures(self) -> None:
        """Stop the running tcpdumps (SIGINT: they flush and close their files). The state is
        re-read first: another process (a bench, ``sample``) may have restarted the captures."""
        state = LabState.load(self.dir) or self.state
        if state is None:
            return
        if self.state is not None:
            self.state = state
        caps = [p for p in state.procs if p.kind == "capture"]
        for p in caps:
            if p.alive():
                try:
                    os.kill(p.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        for p in caps:
            if p.alive():
                try:
                    wait_until(lambda p=p: not p.alive(), timeout=10, what=f"{p.name} to exit")  # type: ignore[misc]
                except Timeout:
                    os.kill(p.pid, signal.SIGKILL)
        state.procs = [p for p in state.procs if p.kind != "capture"]
        state.save()

    def _start_servers(self) -> None:
        proxy = self.node("proxy")
        self._spawn("memcached", proxy.namespace, ["memcached", "-u", "root", "-l", "127.0.0.1", "-p",
                                                    str(MEMCACHED_PORT), "-U", "0", "-m", "64"], kind="memcached")
        env = {"PYTHONPATH": str(self.dir / "py"), "PYTHONDONTWRITEBYTECODE": "1"}
        for n in self.storage:
            for service in SERVICES:
                self._spawn(f"{n.name}-{service}", n.namespace,
                            [str(SWIFT_BIN / f"swift-{service}-server"), str(self.swift_dir / f"{service}-{n.name}.conf"),
                             "-v"], kind="server", env=env)
        self._spawn("proxy-server", proxy.namespace,
                    [str(SWIFT_BIN / "swift-proxy-server"), str(self.swift_dir / "proxy-server.conf"), "-v"],
                    kind="server", env=env)

    def _wait_ready(self) -> None:
        assert self.state is not None
        client = self.node("client")
        targets = [(n.address, port, f"{service}@{n.name}") for n in self.storage for service, port in SERVICES.items()]
        targets.append((self.node("proxy").address, PROXY_PORT, "proxy"))

        deadline = time.monotonic() + 90
        pending = list(targets)
        while pending:
            dead = [p.name for p in self.state.procs if not p.alive()]
            if dead:
                logs = ", ".join(str(self.log_dir / f"{d}.log") for d in dead)
                raise UserError(f"swift-lab: {', '.join(dead)} exited at start; see {logs}")
            pending = [t for t in pending if not tcp_open(client.namespace, t[0], t[1])]
            if pending and time.monotonic() > deadline:
                raise UserError(f"swift-lab: {', '.join(t[2] for t in pending)} not accepting connections after "
                                f"90s; logs in {self.log_dir}")
            if pending:
                time.sleep(0.5)

    def verify(self) -> dict[str, Any]:
        """A verified PUT then GET of a small object through the proxy, from the client namespace."""
        out = self.run_in_client(["-m", "exporters.swift.lab_client", "--auth", self.auth_url, "--user", AUTH_USER,
                                  "--key", AUTH_KEY, "roundtrip", "--container", "lab-verify", "--sizes", "1,1024"],
                                 timeout=120, what="the verification PUT/GET")
        try:
            result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise UserError(f"swift-lab: verification printed no result: {out[-200:]!r}") from None
        if not result.get("ok"):
            raise UserError(f"swift-lab: verification failed: {result}")
        return result

    def healthy(self, timeout: float = 2.0) -> bool:
        """True when, from the client namespace, tempauth issues a token and the proxy accepts it
        (an account HEAD). ``/healthcheck`` is not enough: after a burst of memcached timeouts
        the proxy error-limits memcached for 60 s and rejects every token meanwhile."""
        code = ("import urllib.request as u\n"
                f"r = u.urlopen(u.Request({self.auth_url!r}, headers={{'X-Auth-User': {AUTH_USER!r}, "
                f"'X-Auth-Key': {AUTH_KEY!r}}}), timeout={timeout})\n"
                "u.urlopen(u.Request(r.headers['X-Storage-Url'], method='HEAD', "
                f"headers={{'X-Auth-Token': r.headers['X-Auth-Token']}}), timeout={timeout}).read()\n")
        try:
            r = subprocess.run(netns_exec(self.node("client").namespace, [sys.executable, "-c", code]),  # noqa: S603
                               capture_output=True, timeout=2 * timeout + 10, check=False)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0

    def run_in_client(self, python_args: list[str], timeout: float, what: str) -> str:
        """Run this project's Python with ``python_args`` inside the client namespace; its stdout."""
        argv = netns_exec(self.node("client").namespace, [sys.executable, *python_args])
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,  # noqa: S603
                               cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        except subprocess.TimeoutExpired:
            raise UserError(f"swift-lab: {what} did not finish in {timeout:.0f}s") from None
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()
            raise UserError(f"swift-lab: {what} failed (exit {r.returncode}): {tail[-1] if tail else ''}")
        return r.stdout

    def serve_argv(self, listen: str = "127.0.0.1:9315") -> list[str]:
        """The capture exporter's command that reads every node of this lab live (tcpdump in each
        namespace) and serves ``/metrics`` for Prometheus (``promreflex swift-timing serve``)."""
        argv = ["promreflex", "swift-timing", "serve", "--roles", str(self.dir / ROLES_FILE),
                "--snaplen", str(self.cfg.snaplen), "--web.listen-address", listen]
        for n in self.nodes:
            argv += ["--live", f"{n.name}={NODE_IFACE}@{n.namespace}"]
        return argv

    # ---- shaping and delays (the bench's injections)
    def set_object_delay(self, node: str, delay_ms: float) -> None:
        """Delay every object PUT/GET on ``node``'s object server by ``delay_ms`` (0: off)."""
        if self.node(node).role != "storage":
            raise UserError(f"swift-lab: {node} is not a storage node")
        path = self.delay_file(node)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{max(0.0, float(delay_ms))}\n")

    def shape_link(self, node: str, rate: str | None) -> None:
        """Shape the bridge's port towards ``node`` (traffic *into* the node) with a token bucket
        filter at ``rate`` (e.g. ``20mbit``); ``None`` removes it. The queueing happens between
        the sender's capture and the receiver's capture, so it shows as that hop's transit."""
        dev = f"v-{self.node(node).name}"
        _run(["tc", "-n", self.bridge_ns, "qdisc", "del", "dev", dev, "root"], "removing shaping", ok=(0, 2))
        if rate:
            _run(["tc", "-n", self.bridge_ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                  "burst", "16kb", "latency", "2s"], f"shaping the link to {node}")

    # ---- down / status
    def down(self) -> list[str]:
        """Stop every process and delete every namespace this lab made (state file, then the
        namespace name prefix for anything a crash left unrecorded). Idempotent."""
        state = LabState.load(self.dir)
        removed: list[str] = []
        procs = state.procs if state else []
        # Servers first, captures last (so they see the connections close).
        for kind in ("server", "memcached", "capture"):
            for p in procs:
                if p.kind == kind and p.alive():
                    sig = signal.SIGINT if kind == "capture" else signal.SIGTERM
                    try:
                        os.kill(p.pid, sig)
                    except ProcessLookupError:
                        continue
                    removed.append(f"{p.name} (pid {p.pid})")
            for p in procs:
                if p.kind == kind and p.alive():
                    try:
                        wait_until(lambda p=p: not p.alive(), timeout=10, what=p.name)  # type: ignore[misc]
                    except Timeout:
                        try:
                            os.kill(p.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
        namespaces = list(dict.fromkeys([*(state.namespaces if state else []), *self._leftover_namespaces()]))
        present = set(netns_list())
        for ns in namespaces:
            if ns not in present:
                continue
            # Anything still inside one of our namespaces is ours (a Swift worker, a client).
            for pid in netns_pids(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                wait_until(lambda ns=ns: not netns_pids(ns), timeout=10, what=f"processes in {ns} to exit")  # type: ignore[misc]
            except Timeout:
                pass
            _run(["ip", "netns", "del", ns], f"deleting namespace {ns}", ok=(0, 1))
            removed.append(f"namespace {ns}")
        if state is not None:
            (self.dir / STATE_FILE).unlink(missing_ok=True)
        self.state = None
        return removed

    def status(self) -> dict[str, Any]:
        state = LabState.load(self.dir)
        present = set(netns_list())
        leftovers = sorted(ns for ns in present if ns.startswith(self.prefix + "-"))
        if state is None:
            return {"up": False, "lab_dir": str(self.dir), "leftover_namespaces": leftovers}
        procs = {p.name: {"pid": p.pid, "alive": p.alive(), "kind": p.kind} for p in state.procs}
        caps = {}
        if state.capture_dir:
            for n in state.nodes:
                path = Path(state.capture_dir) / f"{n['name']}.pcap"
                caps[n["name"]] = {"path": str(path), "bytes": path.stat().st_size if path.exists() else None}
        ns_up = {ns: ns in present for ns in state.namespaces}
        up = bool(state.ready and procs and all(v["alive"] for v in procs.values()) and all(ns_up.values()))
        return {"up": up, "ready": state.ready, "lab_dir": str(self.dir), "subnet": state.subnet,
                "nodes": state.nodes, "namespaces": ns_up, "processes": procs, "captures": caps,
                "auth_url": self.auth_url, "leftover_namespaces": [ns for ns in leftovers if ns not in ns_up]}


# -- CLI ---------------------------------------------------------------------------------------

def _lab(args: argparse.Namespace) -> SwiftLab:
    return SwiftLab(LabConfig(lab_dir=args.lab_dir or default_lab_dir(), subnet=getattr(args, "subnet", DEFAULT_SUBNET),
                              storage_nodes=getattr(args, "storage_nodes", 3), replicas=getattr(args, "replicas", None),
                              snaplen=getattr(args, "snaplen", DEFAULT_SNAPLEN),
                              proxy_workers=getattr(args, "proxy_workers", 1),
                              storage_workers=getattr(args, "storage_workers", 1)))


def cmd_up(args: argparse.Namespace) -> int:
    lab = _lab(args)
    print(f"swift-lab: building {len(lab.nodes)} namespaces in {lab.dir} ...", flush=True)
    t0 = time.monotonic()
    lab.up(verify=not args.no_verify)
    print(f"swift-lab: up in {time.monotonic() - t0:.1f}s{'' if args.no_verify else ' (verified PUT/GET)'}")
    for n in lab.nodes:
        print(f"  {n.name:<7} {n.role:<8} {n.address:<14} netns {n.namespace}")
    print(f"  auth       {lab.auth_url}  user {AUTH_USER} key {AUTH_KEY}")
    print(f"  captures   {lab.dir / 'captures'}/<node>.pcap (nanosecond, snaplen {lab.cfg.snaplen})")
    print(f"  roles      {lab.dir / ROLES_FILE}")
    print(f"  logs       {lab.log_dir}")
    print(f"  a shell in the client: ip netns exec {lab.node('client').namespace} bash")
    print(f"  metrics:   uv run {' '.join(lab.serve_argv())}")
    print("             (then scrape 127.0.0.1:9315: stack.extra_scrape: [{job: swift, targets: ['127.0.0.1:9315']}])")
    print(f"  stop it:   promreflex swift-lab down --lab.dir {lab.dir}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    lab = _lab(args)
    removed = lab.down()
    print(f"swift-lab: removed {len(removed)} item(s) from {lab.dir}" if removed else f"swift-lab: nothing up in {lab.dir}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    try:
        lab = SwiftLab.attach(args.lab_dir)
    except UserError:
        lab = _lab(args)
    st = lab.status()
    if args.json:
        print(json.dumps(st, indent=1))
        return 0 if st["up"] else 1
    if "processes" not in st:
        extra = f"; leftover namespaces {', '.join(st['leftover_namespaces'])} (run down)" if st["leftover_namespaces"] else ""
        print(f"swift-lab: nothing up in {lab.dir}{extra}")
        return 1
    print(f"swift-lab: {'up' if st['up'] else 'DEGRADED' if st['ready'] else 'not ready'} in {lab.dir} "
          f"(subnet {st['subnet']}, auth {st['auth_url']})")
    for name, p in st["processes"].items():
        print(f"  {name:<20} pid {p['pid']:<8} {'up' if p['alive'] else 'DOWN'}")
    for name, c in st["captures"].items():
        print(f"  capture {name:<12} {c['bytes'] if c['bytes'] is not None else 'missing'} bytes  {c['path']}")
    missing = [ns for ns, ok in st["namespaces"].items() if not ok]
    if missing:
        print(f"  missing namespaces: {', '.join(missing)}")
    return 0 if st["up"] else 1


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``swift-lab up|down|status``."""
    p = subparsers.add_parser("swift-lab", help="a real Swift (proxy, storage nodes, client) in network namespaces, "
                                                "with a packet capture on every node")
    sub = p.add_subparsers(dest="swift_lab_command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--lab.dir", dest="lab_dir", type=Path, default=None,
                        help="where the lab keeps configs, rings, captures, logs and its state "
                             "(default $XDG_STATE_HOME/promreflex/swift-lab, else .promreflex/swift-lab)")
    up = sub.add_parser("up", parents=[common], help="build the namespaces, start Swift and the captures")
    up.add_argument("--subnet", default=DEFAULT_SUBNET, help=f"a /24 inside 10.200.0.0/16 (default {DEFAULT_SUBNET})")
    up.add_argument("--storage-nodes", dest="storage_nodes", type=int, default=3, help="storage nodes, 1..8 (default 3)")
    up.add_argument("--replicas", type=int, default=None, help="copies of each object (default min(3, nodes))")
    up.add_argument("--snaplen", type=int, default=DEFAULT_SNAPLEN,
                    help=f"bytes kept per packet (default {DEFAULT_SNAPLEN}: headers plus the HTTP head)")
    up.add_argument("--proxy-workers", dest="proxy_workers", type=int, default=1, help="proxy worker processes (default 1)")
    up.add_argument("--storage-workers", dest="storage_workers", type=int, default=1,
                    help="workers per storage server (default 1)")
    up.add_argument("--no-verify", dest="no_verify", action="store_true", help="skip the verified PUT/GET")
    up.set_defaults(func=cmd_up)
    sub.add_parser("down", parents=[common], help="stop everything the lab started and delete its namespaces"
                   ).set_defaults(func=cmd_down)
    st = sub.add_parser("status", parents=[common], help="what is up (exit 1 when the lab is not fully up)")
    st.add_argument("--json", action="store_true", help="print the status as JSON")
    st.set_defaults(func=cmd_status)
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m exporters.swift.lab up|down|status`` (the same as ``promreflex swift-lab``)."""
    parser = argparse.ArgumentParser(prog="promreflex swift-lab")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["swift-lab", *(argv if argv is not None else sys.argv[1:])])
    try:
        return int(args.func(args))
    except UserError as e:
        print(f"promreflex: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
