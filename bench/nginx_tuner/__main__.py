"""Reproduce the keepalive_timeout study on real nginx, with thinking clients and repeats.

Setup (all on loopback, in a temporary prefix, stopped at the end):
- a backend nginx serving the paper's two files: ``index.html`` (133 KB) and ``index.css``
  (243 KB), 1 worker;
- the proxy nginx under test (1 worker, ``proxy_pass`` with upstream keepalive, stub_status on
  a second port), starting at ``keepalive_timeout 65`` (Debian's shipped nginx.conf: the
  "current" value the keep-current rule compares against). It serves HTTPS (a self-signed
  P-256 certificate made with openssl; no session cache, so a new connection pays a full
  handshake, as a first visit does) unless ``--plain``: on loopback a bare TCP handshake costs
  tens of microseconds, so only TLS makes "closed connections cost handshakes" measurable;
- Locust thinking clients (``controllers/nginx_tuner/locustfile.py``): one page view = GET
  index.html then index.css on the user's one connection, then a uniform think time.

The sweep runs the full interleaved grid (``controllers.nginx_tuner.sweep``), prints the table
(mean, p95, memory with 95 % intervals, idle connections and new connections per request),
the front, the choice against nginx's built-in 75 s, Debian's 65 s and the paper's 60 s, and
then replays the early-stopping rule over the same records: runs-to-decision of early
stopping vs the full grid, and whether the decision is the same.

    flock /tmp/promreflex-heavy.lock uv run python -m bench.nginx_tuner          # ~9 minutes
    flock /tmp/promreflex-heavy.lock uv run python -m bench.nginx_tuner --quick  # ~2 minutes

Results: ``bench/results/nginx_tuner/`` (``--quick``: its ``quick/`` folder): ``summary.md`` and
``summary.json`` (the table, the command and the conditions: CPU busy and steal, load average,
sampled with psutil) and ``sweep-pareto.png`` are small and committed; ``sweep.json`` and
``sweep-trials.csv`` (every trial) are raw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.request
import time
from pathlib import Path
from typing import Any

from bench.conditions import HostSampler, describe
from controllers.nginx_tuner.memory import nginx_memory
from controllers.nginx_tuner.nginx_ctl import NginxControl
from controllers.nginx_tuner.pareto import Interval
from controllers.nginx_tuner.procfs import children
from controllers.nginx_tuner.sweep import DEFAULTS, LoadMeasurer, Sweep, SweepSettings, replay, summary_table, write_results
from promreflex.foundation import nginx_temp_paths
from promreflex.proc import Child, free_port, http_ok, pid_alive, port_in_use, wait_until

NGINX = "/usr/sbin/nginx"
RESULTS = Path(__file__).resolve().parents[1] / "results" / "nginx_tuner"
PAGE_SIZES = {"index.html": 133 * 1024, "index.css": 243 * 1024}

# Full: 7 candidates x 4 repeats = 28 trials of (5 s ramp + 10 s measured + ~3 s apply and
# Locust start) ~ 9 minutes. Think times 2..20 s put the interesting part of the grid (2..20 s)
# inside the think-time distribution; 60/65/75 outlast every think time, so they should tie.
FULL: dict[str, Any] = {"candidates": (2.0, 5.0, 10.0, 20.0, 60.0, 65.0, 75.0), "repeats": 4, "duration": 10.0, "users": 200,
        "spawn_rate": 40.0, "think": (2.0, 20.0), "min_repeats": 2}
QUICK: dict[str, Any] = {"candidates": (2.0, 15.0, 65.0), "repeats": 3, "duration": 5.0, "users": 100, "spawn_rate": 50.0, "think": (1.0, 8.0),
         "min_repeats": 2}

COMMON = """worker_processes 1;
worker_shutdown_timeout 2s;
pid logs/nginx.pid;
error_log logs/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
""" + nginx_temp_paths("tmp") + "\n"

PROXY = COMMON + """    client_header_timeout 10s;
    keepalive_timeout 65;
    upstream backend {{ server 127.0.0.1:{backend}; keepalive 32; }}
    server {{
        listen 127.0.0.1:{port}{ssl};
        server_name proxy.test;
        {tls}
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffers 32 8k;
        }}
    }}
    server {{
        listen 127.0.0.1:{status};
        location = /stub_status {{ stub_status; }}
    }}
}}
"""

BACKEND = COMMON + """    types {{ text/html html; text/css css; }}
    keepalive_timeout 300;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port};
        root html;
    }}
}}
"""


def page(name: str, size: int) -> bytes:
    """Deterministic filler of exactly ``size`` bytes that looks like HTML or CSS."""
    if name.endswith(".css"):
        unit = b".product-card .price{color:#c00;font-weight:700;margin:0 0 4px}\n"
        head = b"/* promreflex bench stylesheet */\n"
    else:
        unit = b'<div class="product-card"><a href="/p/1">Item</a><span class="price">9.99</span></div>\n'
        head = b"<!doctype html><html><head><link rel=stylesheet href=/index.css></head><body>\n"
    body = head + unit * (size // len(unit) + 1)
    return body[:size]


def start_nginx(base: Path, name: str, conf_text: str, html: dict[str, bytes] | None = None) -> tuple[Path, Path, Child]:
    prefix = base / name
    for sub in ("logs", "tmp", "html"):
        (prefix / sub).mkdir(parents=True)
    for fname, data in (html or {}).items():
        (prefix / "html" / fname).write_bytes(data)
    conf = prefix / "nginx.conf"
    conf.write_text(conf_text)
    child = Child(name, [NGINX, "-p", f"{prefix}/", "-c", str(conf), "-g", "daemon off;"], prefix / "logs" / "stdout.log").start()
    return prefix, conf, child


def stop_nginx(child: Child) -> None:
    kids = children(child.pid) if child.alive() else []
    child.stop()
    wait_until(lambda: not any(pid_alive(p) for p in kids), timeout=20, what=f"{child.name} workers to exit")


def make_cert(d: Path) -> str:
    """A self-signed P-256 certificate; returns the nginx directives that use it."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",  # noqa: S603,S607
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "2", "-subj", "/CN=proxy.test"],
                   check=True, capture_output=True, timeout=30)
    return f"ssl_certificate {d / 'cert.pem'}; ssl_certificate_key {d / 'key.pem'}; ssl_session_cache off; ssl_session_tickets off;"


def tls_ok(url: str) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:  # noqa: S310 - our loopback proxy
            return resp.status == 200
    except (OSError, ValueError):
        return False


def compare_defaults(result) -> list[str]:  # noqa: ANN001
    """The choice against each default: differences of means and whether intervals separate."""
    if result.choice is None:
        return ["no choice (nothing measured)"]
    by = {p.value: p for p in result.points}
    c = by.get(result.choice.value)
    out = []
    for name, v in DEFAULTS.items():
        d = by.get(v)
        if c is None or d is None:
            out.append(f"  vs {name} {v:g} s: not measured")
            continue

        def sig(a: Interval, b: Interval) -> str:
            return "significant" if (a.below(b) or b.below(a)) else "not significant (intervals overlap)"

        out.append(
            f"  {result.choice.value:g} s vs {name} {v:g} s: mean response time {1000 * (c.rt.mean - d.rt.mean):+.3f} ms "
            f"({sig(c.rt, d.rt)}), memory {(c.mem.mean - d.mem.mean) / 1024:+.0f} KiB ({sig(c.mem, d.mem)})"
        )
    return out


async def main_async(args: argparse.Namespace) -> int:
    prof = QUICK if args.quick else FULL
    candidates = prof["candidates"] if args.candidates is None else tuple(float(v) for v in args.candidates.split(","))
    repeats = args.repeats or prof["repeats"]
    duration = args.duration or prof["duration"]
    users = args.users or prof["users"]
    think_min, think_max = (args.think_min or prof["think"][0]), (args.think_max or prof["think"][1])
    spawn_rate = args.spawn_rate or prof["spawn_rate"]
    tls = args.tls
    scheme = "https" if tls else "http"
    out = Path(args.out)
    base = Path(tempfile.mkdtemp(prefix="promreflex-bench-nginx-tuner-"))
    base.chmod(0o755)
    bport, pport, sport = free_port(), free_port(), free_port()
    html = {k: page(k, v) for k, v in PAGE_SIZES.items()}
    started = time.monotonic()
    la_start = os.getloadavg()
    host = HostSampler(interval=2.0).start()
    print(f"nginx keepalive tuner bench ({'quick' if args.quick else 'full'}): candidates {', '.join(f'{c:g}' for c in candidates)} s, "
          f"{repeats} repeats, {duration:g} s per trial, {users} users thinking {think_min:g}..{think_max:g} s (uniform), "
          f"arriving at {spawn_rate:g}/s; page view = index.html 133 KB + index.css 243 KB over {scheme.upper()}; load average at start {la_start[0]:.2f} {la_start[1]:.2f} {la_start[2]:.2f}")
    backend = proxy = relay = None
    try:
        _, _, backend = start_nginx(base, "backend", BACKEND.format(port=bport), html)
        tls_conf = make_cert(base) if tls else ""
        prefix, conf, proxy = start_nginx(base, "proxy", PROXY.format(port=pport, backend=bport, status=sport,
                                                                      ssl=" ssl" if tls else "", tls=tls_conf))
        url = f"{scheme}://127.0.0.1:{pport}/index.html"
        client_port = pport
        if args.handshake_ms > 0:
            client_port = free_port()
            relay = Child("relay", [sys.executable, "-m", "bench.nginx_tuner.relay", "--listen", f"127.0.0.1:{client_port}",
                                    "--upstream", f"127.0.0.1:{pport}", "--handshake-ms", str(args.handshake_ms)],
                          base / "relay.log").start()
            wait_until(lambda: port_in_use("127.0.0.1", client_port), timeout=20, what="handshake relay")
        check = (lambda: tls_ok(url)) if tls else (lambda: http_ok(url))
        wait_until(check, timeout=20, what="proxy nginx")
        ctl = NginxControl(conf, prefix, NGINX, health_check=check, reload_timeout=20.0)
        print(f"nginx idle memory (PSS, master+worker): {nginx_memory(ctl.master_pid()).total_bytes / 1024:.0f} KiB")
        settings = SweepSettings(candidates=candidates, repeats=repeats, seed=args.seed, min_repeats=prof["min_repeats"])
        measure = LoadMeasurer(ctl, f"{scheme}://127.0.0.1:{client_port}/", memory_scope=args.memory_scope, memory_method=args.memory_method, users=users, spawn_rate=spawn_rate, duration_s=duration,
                               think_min=think_min, think_max=think_max, stub_status_url=f"http://127.0.0.1:{sport}/stub_status",
                               paths=("/index.html", "/index.css"))
        warm = await measure(65.0)  # one discarded run: the first run after start reads high (cold caches, heap)
        print(f"warm-up run at 65 s (discarded): mean {warm.mean_s * 1000:.2f} ms, memory {warm.memory_bytes / 1024:.0f} KiB")
        sweep = Sweep(settings, lambda v: ctl.apply(int(v)), measure, 65.0)
        result = await sweep.run()
        result.load_average = os.getloadavg()
        es_choice, es_runs, es_dropped = replay(result.records, sweep.plan, 65.0, sweep.settings)
        lines = [summary_table(result), "", "choice against the defaults:", *compare_defaults(result), ""]
        full_dec = (result.choice.value, result.choice.kept_current) if result.choice else None
        es_dec = (es_choice.value, es_choice.kept_current) if es_choice else None
        lines.append(
            f"runs to decision: full grid {result.runs_used} load runs; early stopping (replayed on the same runs: prune "
            f"CI-dominated candidates, stop when the decision is unchanged for {settings.patience} rounds from round "
            f"{settings.min_repeats}) {es_runs} load runs, decision "
            f"{'the same' if es_dec == full_dec else f'DIFFERENT ({es_dec} vs {full_dec})'}"
            + (f"; pruned {', '.join(f'{v:g}' for v in es_dropped)}" if es_dropped else "")
        )
        la_end = result.load_average
        conditions = host.stop()
        lines.append(f"conditions: {os.cpu_count()} CPUs, load average {la_start[0]:.2f} at start, {la_end[0]:.2f} {la_end[1]:.2f} "
                     f"{la_end[2]:.2f} at end; {time.monotonic() - started:.0f} s wall; memory method "
                     f"{result.records[0].memory_method if result.records else '?'}; {describe(conditions)}")
        text = "\n".join(lines)
        command = "flock /tmp/promreflex-heavy.lock uv run python -m bench.nginx_tuner " + " ".join(sys.argv[1:])
        print("\n" + text)
        print(f"command: {command}")
        paths = write_results(result, out, title=f"keepalive_timeout, {scheme.upper()}: {users} thinking users ({think_min:g}-{think_max:g} s), {repeats} x {duration:g} s (95% CI)")
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        (out / "summary.md").write_text(f"nginx keepalive tuner, {when}. Command: `{command.strip()}`\n\n```\n{text}\n```\n")
        (out / "summary.json").write_text(json.dumps({"command": command.strip(), "when": when, "conditions": conditions,
                                                      "lines": lines}, indent=1) + "\n")
        print("results: " + ", ".join(str(p) for p in [*paths.values(), out / "summary.md", out / "summary.json"]))
        return 0 if result.final_ok else 1
    finally:
        if relay is not None:
            relay.stop()
        for child in (proxy, backend):
            if child is not None:
                stop_nginx(child)
        shutil.rmtree(base, ignore_errors=True)
        host.stop()


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.nginx_tuner", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 candidates x 3 repeats x 5 s (about 2 minutes)")
    p.add_argument("--candidates", help="comma list of whole seconds (overrides the profile)")
    p.add_argument("--repeats", type=int)
    p.add_argument("--duration", type=float, help="seconds of load per trial")
    p.add_argument("--users", type=int)
    p.add_argument("--spawn-rate", type=float, help="users started per second")
    p.add_argument("--think-min", type=float, help="seconds")
    p.add_argument("--think-max", type=float, help="seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tls", action="store_true", help="HTTPS on the proxy (Locust's gevent TLS client is CPU-heavy here)")
    p.add_argument("--handshake-ms", type=float, default=30.0,
                   help="emulated handshake delay of each new client connection (0: none); default 30 ms")
    p.add_argument("--memory-scope", choices=("all", "workers"), default="workers")
    p.add_argument("--memory-method", choices=("pss", "uss"), default="uss")
    p.add_argument("--out", default=None, help=f"default {RESULTS} (--quick: its quick/ folder)")
    args = p.parse_args()
    if args.out is None:
        args.out = str(RESULTS / "quick" if args.quick else RESULTS)
    if not Path(NGINX).exists():
        print(f"{NGINX} is not installed", flush=True)
        return 2
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
