"""One level of the sweep, run *inside* the lab's client namespace (``ip netns exec <client>
python -m bench.swift.client ...``): ``concurrency`` threads, each with its own
python-swiftclient ``Connection`` (its own keep-alive TCP connection to the proxy, like one
ssbench worker), PUT (or GET) ``count`` objects of ``size`` bytes between them, stop at
``deadline`` seconds. Prints one JSON line: completed, failures (an operation that still failed
after its retries), retries (extra attempts swiftclient made: ``attempts - 1``), errors by kind,
latency percentiles and throughput (completed per second of wall time from the first request to
the last answer). A GET of an object whose PUT failed at that level (404) is counted as
``missing``, not as a failure.

One authentication for the whole level (tempauth token shared by all threads), as ssbench does,
so the sweep measures object traffic, not auth.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from typing import Any

from swiftclient.client import Connection, get_auth
from swiftclient.exceptions import ClientException


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _auth(auth: str, user: str, key: str, attempts: int = 6) -> tuple[str, str]:
    """Authenticate, retrying with backoff (a proxy still draining the previous level may answer
    503 for a while); the last failure propagates."""
    for i in range(attempts):
        try:
            url, token = get_auth(auth, user, key)
            return str(url), str(token)
        except (ClientException, OSError):
            if i == attempts - 1:
                raise
            time.sleep(min(8.0, 0.5 * 2**i))
    raise AssertionError("unreachable")


def run_level(auth: str, user: str, key: str, op: str, size: int, concurrency: int, count: int, deadline: float,
              container: str, retries: int = 3, timeout: float = 20.0) -> dict[str, Any]:
    url, token = _auth(auth, user, key)
    setup = Connection(preauthurl=url, preauthtoken=token, retries=retries)
    setup.put_container(container)
    body = os.urandom(size)
    lock = threading.Lock()
    next_index = [0]
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    totals = {"completed": 0, "failures": 0, "retries": 0, "missing": 0}
    first_start = [float("inf")]
    last_end = [0.0]
    stop_at = time.monotonic() + deadline

    def take() -> int | None:
        with lock:
            if next_index[0] >= count or time.monotonic() >= stop_at:
                return None
            next_index[0] += 1
            return next_index[0] - 1

    def worker() -> None:
        conn = Connection(preauthurl=url, preauthtoken=token, retries=retries, starting_backoff=0.25,
                          max_backoff=2, timeout=timeout)
        while (i := take()) is not None:
            name = f"o{i:06d}"
            t0 = time.time()
            ok = True
            try:
                if op == "put":
                    conn.put_object(container, name, body, content_length=size)
                else:
                    _, got = conn.get_object(container, name)
                    ok = len(got) == size
                    if not ok:
                        raise ValueError(f"short body {len(got)}")
            except ClientException as e:
                ok = False
                kind = f"http {e.http_status}" if e.http_status else f"{type(e).__name__}: {str(e)[:60]}"
                if op == "get" and e.http_status == 404:
                    kind = "missing"  # its PUT failed at this level: not a GET failure
            except (OSError, ValueError) as e:
                ok = False
                kind = type(e).__name__
            t1 = time.time()
            with lock:
                totals["retries"] += max(0, conn.attempts - 1)
                first_start[0] = min(first_start[0], t0)
                last_end[0] = max(last_end[0], t1)
                if ok:
                    totals["completed"] += 1
                    latencies.append(t1 - t0)
                elif kind == "missing":
                    totals["missing"] += 1
                else:
                    totals["failures"] += 1
                    errors[kind] += 1
        conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline + timeout * (retries + 2))
    wall = max(last_end[0] - first_start[0], 1e-9) if totals["completed"] + totals["failures"] else 0.0
    return {"op": op, "size": size, "concurrency": concurrency, "requested": count,
            "attempted": next_index[0], **totals, "errors": dict(errors),
            "wall_s": round(wall, 4), "throughput": round(totals["completed"] / wall, 2) if wall else 0.0,
            "latency_s": {"mean": round(sum(latencies) / len(latencies), 5) if latencies else None,
                          "p50": _pct(latencies, 0.5), "p90": _pct(latencies, 0.9), "p99": _pct(latencies, 0.99)},
            "started": first_start[0] if first_start[0] != float("inf") else None, "ended": last_end[0] or None,
            "stopped_by_deadline": next_index[0] < count,
            "client_cpu_s": round(time.process_time(), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.swift.client")
    p.add_argument("--auth", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--op", choices=["put", "get"], required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--deadline", type=float, default=30.0, help="seconds; no new request after it")
    p.add_argument("--container", required=True)
    p.add_argument("--retries", type=int, default=3)
    p.add_argument("--timeout", type=float, default=20.0, help="socket timeout per request")
    a = p.parse_args(argv)
    if not (1 <= a.concurrency <= 4096 and 1 <= a.count <= 1_000_000 and 0 <= a.size <= 64 * 1024 * 1024):
        print(json.dumps({"error": "concurrency 1..4096, count 1..1e6, size 0..64 MiB"}))
        return 2
    try:
        result = run_level(a.auth, a.user, a.key, a.op, a.size, a.concurrency, a.count, a.deadline, a.container,
                           a.retries, a.timeout)
    except (ClientException, OSError) as e:
        print(json.dumps({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
