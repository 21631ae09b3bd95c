"""The controller's guarantee across SIGKILL, on the real process: *at least once per
transition, a completed transition never again*.

A burst of 200 alerts (firing, then resolved) is posted while the controller is SIGKILLed at
random points and restarted (6 kills). The senders behave like Alertmanager: a notification
that did not get a 200 is sent again; one that got a 200 never is. The ``log`` action appends
one line per run. Then:
- no accepted notification is lost: every alert fired, then resolved;
- a transition ran more than once only if a start found it interrupted (its intent recorded,
  its completion not), and at most once more per such start;
- the final applied state is empty (all resolved), in the state API and the metrics.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from controllers.audit import read_audit
from promreflex.proc import wait_until
from tests.controller_process import REPO, ControllerProcess
from tests.payloads import alert, payload

pytestmark = pytest.mark.integration

N = 200
RANDOM_KILLS_PER_PHASE = 2  # plus one right after each burst, while the actions run


def runs(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


async def burst(ctl: ControllerProcess, alerts: list[dict], kills: int, rng: random.Random) -> int:
    """Post every alert until each got a 200, SIGKILLing the controller ``kills`` times at
    random points of the burst. Returns the number of kills done."""
    accepted = 0
    thresholds = sorted(rng.sample(range(5, len(alerts) - 5), kills))
    sem = asyncio.Semaphore(16)

    async def send(session: aiohttp.ClientSession, a: dict) -> None:
        nonlocal accepted
        body = payload(a)
        async with sem:
            while True:
                try:
                    async with session.post(f"{ctl.url}/webhook", json=body) as resp:
                        if resp.status == 200:
                            accepted += 1
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.05)  # not accepted: sent again, as Alertmanager does

    done = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        senders = asyncio.gather(*(send(session, a) for a in alerts))
        while thresholds and not senders.done():
            if accepted >= thresholds[0]:
                thresholds.pop(0)
                await asyncio.sleep(rng.uniform(0, 0.03))
                await asyncio.to_thread(ctl.kill)
                await asyncio.to_thread(ctl.start)
                done += 1
            await asyncio.sleep(0.002)
        await senders
    await asyncio.to_thread(ctl.kill)  # while the burst's actions run
    await asyncio.to_thread(ctl.start)
    return done + 1


async def test_no_fire_lost_and_no_completed_transition_run_twice_across_sigkills(tmp_path):
    seed = int(os.environ.get("PROMREFLEX_KILL_SEED", random.randrange(1 << 30)))
    print(f"kill points from seed {seed}: PROMREFLEX_KILL_SEED={seed} replays them")  # shown on any failure
    rng = random.Random(seed)
    runs_file = tmp_path / "runs.jsonl"
    ctl = ControllerProcess(tmp_path, routes=[{"name": "burst", "matchers": ['alertname="Burst"'], "action": "log",
                                               "params": {"path": str(runs_file)}}])
    firing = [alert("Burst", instance=f"i{n:03d}") for n in range(N)]
    resolved = [{**a, "status": "resolved", "endsAt": "2026-11-23T10:05:00Z"} for a in firing]
    everyone = {a["fingerprint"] for a in firing}

    def transitions(kind: str) -> set[str]:
        return {r["fingerprint"] for r in runs(runs_file) if r["transition"] == kind}

    ctl.start()
    try:
        kills = await burst(ctl, firing, RANDOM_KILLS_PER_PHASE, rng)
        wait_until(lambda: transitions("fire") == everyone, timeout=60,
                   what=f"every accepted firing alert to fire (seed {seed})")
        kills += await burst(ctl, resolved, RANDOM_KILLS_PER_PHASE, rng)
        wait_until(lambda: transitions("resolve") == everyone, timeout=60,
                   what=f"every accepted resolved alert to resolve (seed {seed})")

        def settled() -> bool:
            with urllib.request.urlopen(  # noqa: S310 - loopback
                    f"{ctl.url}/api/v1/state", timeout=5) as resp:
                return json.load(resp)["entries"] == []

        wait_until(settled, timeout=30, what="no entry left in the state")
        with urllib.request.urlopen(f"{ctl.url}/metrics", timeout=5) as resp:  # noqa: S310 - loopback
            metrics = resp.read().decode()
        assert 'promreflex_controller_applied_alerts{action="log"} 0.0' in metrics
    finally:
        ctl.stop()

    assert kills >= 4 and ctl.starts == kills + 1, (kills, ctl.starts, seed)
    ran = Counter((r["fingerprint"], r["transition"]) for r in runs(runs_file))
    audit = read_audit(ctl.audit_log)
    interrupted = Counter((r["fingerprint"], r["transition"]) for r in audit if r["event"] == "interrupted")
    extra = {key: n - 1 for key, n in ran.items() if n > 1}
    beyond = {key: (n, interrupted[key]) for key, n in extra.items() if n > interrupted[key]}
    assert beyond == {}, f"runs beyond the interrupted ones (extra, interrupted), seed {seed}"
    assert set(ran) == {(fp, t) for fp in everyone for t in ("fire", "resolve")}
    print(f"seed {seed}: {kills} kills, {sum(interrupted.values())} interrupted runs found at start, "
          f"{sum(extra.values())} re-runs, {sum(ran.values())} runs for {2 * N} transitions")


@pytest.mark.parametrize("content", [b"SQLite format 3\x00" + b"\x07garbage" * 512, b"{half a JSON state"])
def test_an_unreadable_state_stops_the_controller_with_one_line(tmp_path, content):
    ctl = ControllerProcess(tmp_path, routes=[{"name": "all", "matchers": ['alertname=~".+"'], "action": "log"}])
    ctl.state_file.write_bytes(content)
    proc = subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "promreflex", "controller", "--config.file", str(ctl.config_file())],
        capture_output=True, text=True, timeout=60, cwd=REPO)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1 and f"controller state {ctl.state_file} is unusable" in lines[0], lines
