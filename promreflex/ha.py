"""A highly available alerting path on loopback, from the real binaries: two Prometheus replicas
(``replica`` external label, dropped by ``alert_relabel_configs`` as the Prometheus docs advise for
HA pairs) and an Alertmanager cluster (``--cluster.*`` flags, gossip on loopback ports), all
sending to one webhook URL; and :class:`GaugeSource`, a ``/metrics`` endpoint whose gauge the
caller sets (the incident switch).

What users run, where notifications may arrive more than once and a peer can die in the middle
of an incident. Used by the HA delivery tests (tests/integration/test_ha_delivery.py) and the
bench (``python -m bench.ha_delivery``); ``replicas=1, peers=1`` is the single-host path.
"""

from __future__ import annotations

import http.server
from functools import partial
import re
import signal
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from promreflex.proc import Child, free_port, http_ok, wait_until

PROMETHEUS = Path("/usr/bin/prometheus")
ALERTMANAGER = Path("/usr/bin/prometheus-alertmanager")


class GaugeSource:
    """``/metrics`` with one gauge per shop, set by the caller: ``ha_test_overload{shop="..."}``."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.port = free_port()
        source = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = "# TYPE ha_test_overload gauge\n" + "".join(
                    f'ha_test_overload{{shop="{shop}"}} {v}\n' for shop, v in sorted(source.values.items()))
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> GaugeSource:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class HAPath:
    """Two Prometheus replicas and an Alertmanager cluster of ``peers`` on loopback."""

    dir: Path
    source_port: int
    webhook_url: str
    interval: str = "1s"
    peers: int = 3
    replicas: int = 2
    peer_timeout: str = "15s"  # Alertmanager's default: peer i waits i x this before it notifies
    rule_for: str = "0s"
    # False: the peers never find each other (a partition, gossip down): each one notifies on
    # its own, so every notification arrives once per peer, as Alertmanager's docs warn.
    joined: bool = True
    prometheus: list[Child] = field(default_factory=list)
    alertmanagers: list[Child] = field(default_factory=list)
    prom_ports: list[int] = field(default_factory=list)
    am_ports: list[int] = field(default_factory=list)
    cluster_ports: list[int] = field(default_factory=list)

    @property
    def am_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.am_ports]

    @property
    def prom_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.prom_ports]

    def start(self) -> HAPath:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.am_ports = [free_port() for _ in range(self.peers)]
        self.cluster_ports = [free_port() for _ in range(self.peers)]
        am_config = {
            "route": {"receiver": "promreflex", "group_by": ["alertname", "shop"], "group_wait": "0s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "promreflex", "webhook_configs": [
                {"url": self.webhook_url, "send_resolved": True, "max_alerts": 0}]}],
        }
        (self.dir / "am.yml").write_text(yaml.safe_dump(am_config))
        for i in range(self.peers):
            peers = [f"--cluster.peer=127.0.0.1:{p}" for j, p in enumerate(self.cluster_ports) if j != i and self.joined]
            cluster = ([f"--cluster.listen-address=127.0.0.1:{self.cluster_ports[i]}",
                        f"--cluster.advertise-address=127.0.0.1:{self.cluster_ports[i]}",
                        f"--cluster.peer-timeout={self.peer_timeout}", "--cluster.gossip-interval=200ms",
                        "--cluster.pushpull-interval=5s", *peers]
                       if self.peers > 1 else ["--cluster.listen-address="])
            self.alertmanagers.append(Child(f"alertmanager-{i}", [
                str(ALERTMANAGER), f"--config.file={self.dir / 'am.yml'}", f"--storage.path={self.dir / f'am-{i}'}",
                f"--web.listen-address=127.0.0.1:{self.am_ports[i]}", *cluster,
            ], self.dir / f"alertmanager-{i}.log").start())
        for url in self.am_urls:
            wait_until(partial(http_ok, f"{url}/-/ready"), timeout=60, what=f"alertmanager {url} ready")
        rules = {"groups": [{"name": "ha", "interval": self.interval, "rules": [{
            "alert": "HaTestOverload", "expr": "ha_test_overload > 0", "for": self.rule_for,
            "labels": {"severity": "page"}}]}]}
        (self.dir / "rules.yml").write_text(yaml.safe_dump(rules))
        self.prom_ports = [free_port() for _ in range(self.replicas)]
        for name, port in zip("abcdefgh", self.prom_ports):
            config = {
                "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval,
                           "external_labels": {"replica": name}},
                "rule_files": [str(self.dir / "rules.yml")],
                "scrape_configs": [{"job_name": "source",
                                    "static_configs": [{"targets": [f"127.0.0.1:{self.source_port}"]}]}],
                "alerting": {
                    "alert_relabel_configs": [{"action": "labeldrop", "regex": "replica"}],
                    "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{p}" for p in self.am_ports]}]}],
                },
            }
            (self.dir / f"prometheus-{name}.yml").write_text(yaml.safe_dump(config))
            self.prometheus.append(Child(f"prometheus-{name}", [
                str(PROMETHEUS), f"--config.file={self.dir / f'prometheus-{name}.yml'}",
                f"--storage.tsdb.path={self.dir / f'prom-{name}'}", f"--web.listen-address=127.0.0.1:{port}",
                "--rules.alert.resend-delay=1s",
            ], self.dir / f"prometheus-{name}.log").start())
        for url in self.prom_urls:
            wait_until(partial(http_ok, f"{url}/-/ready"), timeout=60, what=f"prometheus {url} ready")
        return self

    @staticmethod
    def kill(child: Child) -> None:
        """SIGKILL: the peer vanishes mid-incident, nothing of its shutdown code runs."""
        if child.popen is not None and child.popen.poll() is None:
            child.popen.send_signal(signal.SIGKILL)
            child.popen.wait(timeout=30)

    def stop(self) -> None:
        for child in [*self.prometheus, *self.alertmanagers]:
            child.stop()


def counts(url: str, metric: str) -> dict[str, float]:
    """A counter on ``url``'s ``/metrics`` summed by its ``result`` label (the controller's
    ``promreflex_controller_notifications_total``: accepted / duplicate / stale)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:  # noqa: S310 - loopback
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            result = re.search(r'result="(\w+)"', line)
            if result:
                out[result[1]] = out.get(result[1], 0.0) + float(line.rsplit(" ", 1)[1])
    return out
