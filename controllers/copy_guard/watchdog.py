"""The lease keeper for adopted copies: resumes a paused foreign process whose pause lease ran
out, i.e. the controller that paused it stopped renewing (it was killed, or it hangs).

Copies run by ``promreflex copy`` keep their own lease; rsync, cp or tar cannot, so the
copy-guard action starts this small process (its own session, so it outlives a SIGKILLed
controller) whenever it pauses an adopted copy. Every ``interval`` it reads the registry and
resumes each adopted entry whose ``pause.until`` (Unix time) has passed. It exits once the
controller is gone and nothing adopted is paused, or after ``idle`` seconds with nothing paused.

    python -m controllers.copy_guard.watchdog --registry.dir DIR --parent-pid PID
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from controllers.copy_guard import freeze
from controllers.copy_guard.registry import Registry
from promreflex.proc import pid_alive

log = logging.getLogger("promreflex.copy_guard.watchdog")


def sweep(registry: Registry, now: float | None = None) -> tuple[int, int]:
    """Resume adopted copies whose lease expired. Returns (resumed, still paused)."""
    now = time.time() if now is None else now
    resumed = paused = 0
    for entry in registry.entries():
        if entry.kind != "adopted" or not entry.pause:
            continue
        if float(entry.pause.get("until", 0)) > now:
            paused += 1
            continue
        try:
            freeze.resume(entry.pause)
        except (OSError, freeze.PauseError) as e:
            log.warning("could not resume %s: %s", entry.id, e)
            paused += 1
            continue
        current = registry.get(entry.id)
        if current is not None and current.pause and float(current.pause.get("until", 0)) <= now:
            current.pause = None
            registry.update(current)
        resumed += 1
        log.warning("lease of %s (pid %d) expired: resumed", entry.id, entry.pid)
    return resumed, paused


def run(registry_dir: Path, parent_pid: int, interval: float = 0.2, idle: float = 60.0) -> int:
    registry = Registry(registry_dir)
    idle_since = time.monotonic()
    while True:
        _, paused = sweep(registry)
        if paused:
            idle_since = time.monotonic()
        elif not pid_alive(parent_pid) or time.monotonic() - idle_since > idle:
            return 0
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="copy-guard-watchdog", description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry.dir", dest="registry_dir", type=Path, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--idle", type=float, default=60.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(args.registry_dir, args.parent_pid, args.interval, args.idle)


if __name__ == "__main__":
    sys.exit(main())
