"""The simulated fleet (``promreflex fleet up``), on the real binaries in network namespaces: an
overload on one shop pauses that shop's copy, through the HA Prometheus pair, the Alertmanager
cluster's per-shop route and that shop's agent, and no other shop's copy; when it ends the copy
runs again; ``fleet down`` leaves no process and no namespace behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import urllib.request

import pytest

from controllers.fleet.lab import Fleet, Shop
from promreflex.proc import pid_alive, wait_until

pytestmark = pytest.mark.e2e


def paused(shop: Shop) -> float:
    """The agent's own gauge of copies it holds paused for its site."""
    with urllib.request.urlopen(shop.url("agent", "/metrics"), timeout=5) as resp:  # noqa: S310 - our namespace
        text = resp.read().decode()
    m = re.search(r'^promreflex_copy_guard_paused_copies\{site="%s"\} (\S+)$' % shop.name, text, re.M)
    return float(m[1]) if m else 0.0


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path / "fleet")
    try:
        f.up(3, copy_mib=256, copy_rate="2M", progress=lambda _: None)
        yield f
    finally:
        pids = [e["pid"] for e in f.state().get("pids", [])]
        f.down(progress=lambda _: None)
        assert not [p for p in pids if pid_alive(p)], "fleet down left processes"
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert "prxf-" not in namespaces


@pytest.mark.parametrize("kill", [False, True], ids=["steady", "replica-and-peer-killed"])
def test_an_overload_on_one_shop_pauses_only_that_shops_copy(fleet, kill):
    """With ``kill``: as the overload starts, Prometheus replica ``a`` and Alertmanager peer 0
    are SIGKILLed; the survivors still pause the copy and resume it when the overload ends."""
    shops = [Shop(k) for k in (1, 2, 3)]
    wait_until(lambda: all(paused(s) == 0 for s in shops), timeout=60, what="every agent up, nothing paused")
    load = threading.Thread(target=fleet.load, args=(1, 25.0, 20.0), daemon=True)
    load.start()
    if kill:
        for name in ("prometheus-a", "alertmanager-0"):
            pid = next(e["pid"] for e in fleet.state()["pids"] if e["name"] == name)
            os.kill(pid, signal.SIGKILL)
    seen_elsewhere: list[str] = []

    def shop1_paused() -> bool:
        seen_elsewhere.extend(s.name for s in shops[1:] if paused(s) > 0)
        return paused(shops[0]) >= 1

    wait_until(shop1_paused, timeout=60, interval=0.5, what="shop1's copy paused by shop1's agent")
    load.join(timeout=60)

    def shop1_running() -> bool:
        seen_elsewhere.extend(s.name for s in shops[1:] if paused(s) > 0)
        return paused(shops[0]) == 0

    wait_until(shop1_running, timeout=120, interval=0.5, what="shop1's copy running again after the overload")
    assert not seen_elsewhere, f"a quiet shop's copy was paused: {sorted(set(seen_elsewhere))}"
    for s in shops[1:]:
        audit = (fleet.dir / s.name / "agent-audit.jsonl").read_text()
        assert "copy paused" not in audit, f"{s.name}'s agent paused its copy"


def test_down_stops_what_runs_inside_and_a_second_fleet_is_told_where_the_first_is(tmp_path):
    """A stranger's review: a SIGKILLed nginx master left its worker serving, and `fleet down`
    deleted the namespace's name with the worker still in it (running, unlisted); a second
    `fleet up` from another directory died with a CalledProcessError traceback, and `status` or
    `down` there said "no fleet is up"; `fleet load` on a shop that is not up said it answered."""
    from controllers.fleet.lab import UserError
    from controllers.nginx_tuner.procfs import children

    first, second = Fleet(tmp_path / "first"), Fleet(tmp_path / "second")
    try:
        first.up(1, copy_mib=8, copy_rate="1M", progress=lambda _: None)
        master = next(e["pid"] for e in first.state()["pids"] if e["name"] == "shop1-nginx")
        workers = children(master)
        assert workers
        os.kill(master, signal.SIGKILL)
        with pytest.raises(UserError, match="prxf-1 exist but no fleet state .* names them"):
            second.up(1, copy_mib=8, progress=lambda _: None)
        assert "prxf-1" in second.status()[0]
        said: list[str] = []
        second.down(progress=said.append)
        assert "prxf-1" in said[0] and os.path.exists(f"/run/netns/{Shop(1).ns}")  # not the other fleet's to remove
        with pytest.raises(UserError, match="no shop2"):
            first.load(2, 1.0, 5.0)
        with pytest.raises(UserError, match="above 0"):
            first.load(1, 1.0, 0.0)
        agent_log = next(e["log"] for e in first.state()["pids"] if e["name"] == "shop1-agent")
        assert "has no receiver named" not in open(agent_log).read()
    finally:
        said = []
        first.down(progress=said.append)
    assert not [p for p in workers if pid_alive(p)], f"fleet down left nginx workers {workers}: {said}"
    assert "more process(es) found running inside them" in said[0], said
