"""The lease keeper and duty cycler for adopted copies.

Copies run by ``promreflex copy`` keep their own lease and pace themselves; rsync, cp or tar
cannot, so the copy-guard action starts this small process (its own session, so it outlives a
SIGKILLed controller, and its own cgroup where cgroup v2 allows, so it outlives a kill of the
controller's whole cgroup too: ``systemctl kill``) whenever it holds an adopted copy. It reads the registry and, for each
adopted entry with a ``pause`` record:

- the lease (``pause.until``, Unix time) has passed: the controller stopped renewing (it was
  killed, or it hangs), so the copy is resumed (thawed, moved back, record cleared);
- otherwise it applies the record's duty phase (``freeze.duty_phase``): frozen for good at
  duty 0 (a pause), else frozen ``1 - duty`` of every ``period`` and running the rest. It wakes
  at every phase boundary and at least every ``interval`` to see new records, and applies the
  phase at each wake (idempotent), so a restarted watchdog or a thaw by anyone else is corrected
  at once.

Every change happens under the entry's lock (``Registry.locked``), re-reading the entry first,
so it never interleaves with the controller's own freeze or resume. It exits once the controller
is gone and nothing adopted is held, or after ``idle`` seconds with nothing held.

    python -m controllers.copy_guard.watchdog --registry.dir DIR --parent-pid PID
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from promreflex.logs import setup as setup_logging
from controllers.copy_guard import freeze
from controllers.copy_guard.registry import Registry
from promreflex.proc import pid_alive

log = logging.getLogger("promreflex.copy_guard.watchdog")


def sweep(registry: Registry, now: float | None = None) -> tuple[int, int, float]:
    """Resume adopted copies whose lease expired, apply the duty phase of the others.
    Returns (resumed, still held, the time of the next phase boundary or lease end)."""
    now = time.time() if now is None else now
    resumed = held = 0
    wake = float("inf")
    for entry in registry.entries():
        if entry.kind != "adopted" or not entry.pause:
            continue
        try:
            with registry.locked(entry.id):
                current = registry.get(entry.id)
                if current is None or not current.pause:
                    continue
                until = float(current.pause.get("until", 0))
                if until <= now:
                    freeze.resume(current.pause)
                    current.pause = None
                    registry.update(current)
                    resumed += 1
                    log.warning("lease of %s (pid %d) expired: resumed", entry.id, entry.pid)
                    continue
                frozen, ends = freeze.duty_phase(current.pause, now)
                freeze.set_frozen(current.pause, frozen)
                held += 1
                wake = min(wake, ends, until)
        except (OSError, ValueError, freeze.PauseError) as e:
            log.warning("could not keep %s: %s", entry.id, e)
            held += 1
    return resumed, held, wake


def run(registry_dir: Path, parent_pid: int, interval: float = 0.2, idle: float = 60.0) -> int:
    registry = Registry(registry_dir)
    idle_since = time.monotonic()
    while True:
        _, held, wake = sweep(registry)
        if held:
            idle_since = time.monotonic()
        elif not pid_alive(parent_pid) or time.monotonic() - idle_since > idle:
            return 0
        time.sleep(min(interval, max(0.001, wake - time.time())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="copy-guard-watchdog", description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry.dir", dest="registry_dir", type=Path, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--idle", type=float, default=60.0)
    args = parser.parse_args(argv)
    setup_logging()
    if freeze.leave_parent_cgroup() is None:
        log.info("could not leave the controller's cgroup (no writable cgroup v2): a kill of its whole "
                 "cgroup (systemctl kill) kills this watchdog too, and adopted copies stay held until "
                 "the controller runs again")
    return run(args.registry_dir, args.parent_pid, args.interval, args.idle)


if __name__ == "__main__":
    sys.exit(main())
