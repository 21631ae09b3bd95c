"""The proxy's own CPU per request, without the network: ``AdmissionProxy.handle`` on an exempt
(static) request and on a session-page request, aiohttp's client replaced by a stub that answers
at once. What aiohttp's server and client, the event loop and the kernel cost is left out (the
overhead step, ``overhead.py``, measures the whole); what is left is the proxy's own code: header
checks, routing, the session cookie and table, the page slot and its regulator, the metrics, the
header copies both ways, the response. One process per source tree (``--before`` / ``--after``,
e.g. a ``git worktree`` of an older commit and this checkout), the trees alternating, each
measurement the best of a few repetitions (CPU time; the machine's noise only adds)::

    git worktree add /tmp/before-adm 7fd6734
    uv run --frozen python -m bench.admission.handler_cost --before /tmp/before-adm --after .

No lock needed: one process, one core, about 10 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

#: What the child process runs in a source tree (its own ``controllers`` package, this code).
CHILD = r'''
import asyncio, gc, json, os, sys, time
sys.path.insert(0, os.getcwd())
from multidict import CIMultiDict, CIMultiDictProxy
from aiohttp.test_utils import make_mocked_request
from controllers.admission.cli import loop_factory
from controllers.admission.config import AdmissionSection
from controllers.admission.cookies import KeyRing
from controllers.admission.proxy import AdmissionProxy

args = json.loads(sys.argv[1])
BODY = b"<html><body><h1>browse</h1><p>page 2 of 7</p></body></html>\n"
HEADERS = CIMultiDictProxy(CIMultiDict([
    ("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(BODY))),
    ("Date", "Fri, 27 Nov 2026 04:00:00 GMT"), ("Server", "Python/3.11 aiohttp/3.14")]))


class Answer:  # the app's response, as aiohttp's client would hand it over
    status, reason, content_length, headers = 200, "OK", len(BODY), HEADERS

    async def read(self):
        return BODY

    def release(self):
        pass


class Client:
    def request(self, *a, **kw):
        async def answer():
            return Answer()
        return answer()


cfg = AdmissionSection.model_validate(args["section"])


async def main():
    proxy = AdmissionProxy(cfg, KeyRing.ephemeral())
    proxy.client = Client()
    now = time.time()
    s = proxy.sessions.add(proxy.codec.new_sid(), now, now + 3600, "browse")
    cookie = proxy.codec.issue(s.sid, s.issued, 3600)
    common = [("Host", "shop.example"), ("User-Agent", "bench"), ("Accept", "*/*")]
    requests = {
        "static": make_mocked_request("GET", args["static"], headers=CIMultiDict(common)),
        "page": make_mocked_request("GET", args["page"], headers=CIMultiDict(
            common + [("Cookie", cfg.session.cookie_name + "=" + cookie)])),
    }
    gc.collect()  # as the proxy's own start does (controllers/admission/cli.py)
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    best = {}
    for _ in range(args["repeat"]):
        for name, request in requests.items():
            t0 = time.process_time()
            for _ in range(args["requests"]):
                resp = await proxy.handle(request)
            us = (time.process_time() - t0) / args["requests"] * 1e6
            assert resp.status == 200, (name, resp.status)
            best[name] = min(best.get(name, us), us)
    print(json.dumps(best))

with asyncio.Runner(loop_factory=loop_factory(cfg.event_loop)) as runner:  # uvloop, as the proxy
    runner.run(main())
'''


def measure(tree: Path, section: dict[str, Any], requests: int, repeat: int) -> dict[str, float]:
    """Best microseconds per request of each path, the proxy's code from ``tree``."""
    from bench.admission.pages import PAGES, STATIC_PATH

    arg = json.dumps({"section": section, "static": STATIC_PATH, "page": PAGES[1].path + "?inline=1",
                      "requests": requests, "repeat": repeat})
    out = subprocess.run([sys.executable, "-c", CHILD, arg], cwd=tree.resolve(), check=True,  # noqa: S603
                         capture_output=True, text=True, timeout=300)
    return {k: float(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def main(argv: list[str] | None = None) -> int:
    from bench.admission.arms import proxy_config

    ap = argparse.ArgumentParser(prog="python -m bench.admission.handler_cost", description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, default=None, help="source tree of the proxy before a change")
    ap.add_argument("--after", type=Path, default=Path("."), help="source tree of the proxy after it (default .)")
    ap.add_argument("--rounds", type=int, default=3, help="processes per tree, the trees alternating")
    ap.add_argument("--requests", type=int, default=20000, help="requests per measurement")
    ap.add_argument("--repeat", type=int, default=3, help="measurements per path and process (the best counts)")
    args = ap.parse_args(argv)
    section = proxy_config(0, 1, 0, 0.1, session_scheduler=True)["admission"]
    trees = {"before": args.before, "after": args.after} if args.before is not None else {"after": args.after}
    best: dict[str, dict[str, float]] = {name: {} for name in trees}
    for r in range(args.rounds):
        for name, tree in (trees.items() if r % 2 == 0 else reversed(trees.items())):
            got = measure(tree, section, args.requests, args.repeat)
            print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.2f} us" for k, v in got.items()), flush=True)
            for k, v in got.items():
                best[name][k] = min(best[name].get(k, v), v)
    for name, got in best.items():
        print(f"{name} ({trees[name]}): static {got['static']:.2f} us, session page {got['page']:.2f} us per request "
              f"(the page adds {got['page'] - got['static']:.2f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
