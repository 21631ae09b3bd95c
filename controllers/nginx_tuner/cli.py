"""Command line of the keepalive tuner: ``promreflex tune-nginx`` and ``promreflex exporter-nginx-memory``.

``tune-nginx`` sweeps ``keepalive_timeout`` over candidates on a running nginx, measures each
(``--mode active``: Locust thinking clients; ``--mode passive``: live traffic read back from
Prometheus), chooses on the Pareto front and applies the choice, or keeps the current value
when the pick is not significantly better. Every change is an ``nginx -t``-checked,
rolled-back-on-failure reload. Results: ``sweep.json``, ``sweep-trials.csv`` and
``sweep-pareto.png`` under ``--results.dir``; metrics on ``--web.listen-address`` while it runs.

``exporter-nginx-memory`` serves ``promreflex_nginx_memory_bytes`` (PSS summed over master and
workers) for the nginx whose pid file is given: what passive mode and the memory alert read.

Exit codes: 0 done (applied or kept), 1 the sweep could not return nginx to a good config or
measured nothing, 2 bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
from pathlib import Path

from promreflex.config import parse_duration

TUNE = "tune-nginx"
EXPORTER = "exporter-nginx-memory"


def parse_candidates(text: str) -> tuple[float, ...]:
    """``5..100:5`` (start..stop:step, inclusive) or ``5,10,30``; whole seconds."""
    m = re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d+)\s*(?::\s*(\d+))?\s*", text)
    if m:
        lo, hi, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
        if step < 1 or hi < lo:
            raise argparse.ArgumentTypeError(f"bad range {text!r}: need start <= stop and step >= 1")
        return tuple(float(v) for v in range(lo, hi + 1, step))
    try:
        vals = tuple(float(int(v)) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"candidates: expected START..STOP:STEP or a comma list of whole seconds, got {text!r}") from None
    if not vals:
        raise argparse.ArgumentTypeError("candidates: empty list")
    return vals


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("nginx")
    g.add_argument("--nginx.config", dest="nginx_config", type=Path, required=True, help="the -c file of the running nginx")
    g.add_argument("--nginx.prefix", dest="nginx_prefix", type=Path, help="its -p prefix (default: the config's folder)")
    g.add_argument("--nginx.binary", dest="nginx_binary", default="/usr/sbin/nginx",
                   help="nginx program used for -t and -s reload (default /usr/sbin/nginx)")
    g.add_argument("--nginx.pid-file", dest="nginx_pid_file", type=Path, help="default: from the config / nginx -V")
    g.add_argument("--nginx.server-name", dest="server_name", help="tune this server block instead of http")
    g.add_argument("--nginx.health-url", dest="health_url", help="GET after each reload must answer 2xx (default: --load.url in active mode)")
    g.add_argument("--nginx.stub-status-url", dest="stub_status_url", help="stub_status page: idle connections and handshakes per request")
    g.add_argument("--nginx.reload-timeout", dest="reload_timeout", type=_duration, default=30.0,
                   help="longest wait for the new workers after a reload (default 30s)")
    s = p.add_argument_group("sweep")
    s.add_argument("--candidates", type=parse_candidates, default=parse_candidates("5..100:5"), help="START..STOP:STEP or a,b,c (default 5..100:5)")
    s.add_argument("--repeats", type=int, default=3, help="trials per candidate (default 3)")
    s.add_argument("--seed", type=int, default=0, help="seed of the trial order (default 0)")
    s.add_argument("--confidence", type=float, default=0.95,
                   help="confidence required to prefer a candidate over the current value (default 0.95)")
    s.add_argument("--rule", choices=("sum", "utopia"), default="sum",
                   help="pick on the Pareto front: lowest normalised sum, or nearest the utopia point (default sum)")
    s.add_argument("--max-error-ratio", type=float, default=0.01, help="a trial above this failure ratio rolls back (default 0.01)")
    s.add_argument("--early-stop", action="store_true", help="prune dominated candidates and stop once the decision is stable")
    s.add_argument("--min-repeats", type=int, default=3, help="with --early-stop: trials before pruning (default 3)")
    s.add_argument("--patience", type=int, default=2,
                   help="with --early-stop: rounds the decision must stay the same (default 2)")
    s.add_argument("--mode", choices=("active", "passive"), default="active",
                   help="active: generate load with Locust; passive: measure live traffic via Prometheus (default active)")
    a = p.add_argument_group("active mode (Locust thinking clients)")
    a.add_argument("--load.url", dest="load_url", help="URL the Locust clients load (required in active mode)")
    a.add_argument("--load.users", dest="users", type=int, default=300, help="thinking clients (default 300)")
    a.add_argument("--load.spawn-rate", dest="spawn_rate", type=float, default=30, help="users started per second (default 30: a 10 s ramp for 300 users)")
    a.add_argument("--load.duration", dest="duration", type=_duration, default=20.0,
                   help="length of each trial (default 20s)")
    a.add_argument("--load.think-min", dest="think_min", type=_duration, default=0.5,
                   help="shortest think time between a client's requests (default 500ms)")
    a.add_argument("--load.think-max", dest="think_max", type=_duration, default=8.0,
                   help="longest think time between a client's requests (default 8s)")
    q = p.add_argument_group("passive mode (live traffic, read from Prometheus)")
    q.add_argument("--prometheus.url", dest="prometheus_url", default="http://127.0.0.1:9090",
                   help="Prometheus holding the access-log exporter's series (default http://127.0.0.1:9090)")
    q.add_argument("--passive.site", dest="site", default="shop", help="site label of the access-log exporter")
    q.add_argument("--passive.dwell", dest="dwell", type=_duration, default=300.0,
                   help="how long each candidate serves live traffic (default 5m)")
    q.add_argument("--passive.settle", dest="settle", type=_duration, default=15.0,
                   help="time after a reload left out of the measurement (default 15s)")
    q.add_argument("--passive.memory-query", dest="memory_query", default=None,
                   help="PromQL for nginx memory (default sum(promreflex_nginx_memory_bytes))")
    q.add_argument("--passive.min-requests", dest="min_requests", type=int, default=20,
                   help="fewer requests in a dwell make the trial inconclusive (default 20)")
    o = p.add_argument_group("output")
    o.add_argument("--results.dir", dest="results_dir", type=Path, default=Path(".promreflex/tune-nginx"),
                   help="where sweep.json, sweep-trials.csv and sweep-pareto.png go (default .promreflex/tune-nginx)")
    o.add_argument("--web.listen-address", dest="listen_address", default="", help="serve the tuner's /metrics here while it runs")


def problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the flags, all at once, before nginx or its config is touched (a typo
    found mid-sweep left a trial live or a journal behind: a stranger's review)."""
    import shutil
    from urllib.parse import urlsplit

    from promreflex.proc import port_in_use

    out = []
    binary = args.nginx_binary
    if not (shutil.which(binary) if "/" not in binary else (os.path.isfile(binary) and os.access(binary, os.X_OK))):
        out.append(f"--nginx.binary {binary}: not an executable program")
    if not 0 < args.confidence < 1:
        out.append(f"--confidence {args.confidence:g}: give a level between 0 and 1 (0.95)")
    if not args.reload_timeout > 0:
        out.append(f"--nginx.reload-timeout {args.reload_timeout:g}s: must be above 0")
    for flag, url in (("--load.url", args.load_url), ("--nginx.health-url", args.health_url),
                      ("--nginx.stub-status-url", args.stub_status_url), ("--prometheus.url", args.prometheus_url)):
        if url is not None and (urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc):
            out.append(f"{flag} {url}: not an http(s) URL")
    if args.mode == "active":
        if args.users < 1 or not args.spawn_rate > 0:
            out.append(f"--load.users {args.users} / --load.spawn-rate {args.spawn_rate:g}: need at least 1 user started at a rate above 0")
        if not args.duration > 0:
            out.append(f"--load.duration {args.duration:g}s: must be above 0")
        if args.think_min > args.think_max:
            out.append(f"--load.think-min {args.think_min:g}s is above --load.think-max {args.think_max:g}s")
    if args.listen_address:
        host, _, port = args.listen_address.rpartition(":")
        if not port.isdigit() or port_in_use(host.strip("[]") or "0.0.0.0", int(port)):
            out.append(f"--web.listen-address {args.listen_address}: not a free HOST:PORT")
    return out


def _current(ctl) -> float | None:  # noqa: ANN001
    """The value in force for the tuned scope: the nearest definition going up (server, then
    http), else nginx's built-in 75 s; not merely what is written in the scope itself."""
    return ctl.effective_seconds()


async def run_tune(args: argparse.Namespace, progress=print) -> int:  # noqa: ANN001
    """The whole ``tune-nginx`` run; returns the exit code."""
    from prometheus_client import CollectorRegistry

    from controllers.nginx_tuner.metrics import TunerMetrics
    from controllers.nginx_tuner.nginx_ctl import ApplyResult, NginxControl
    from controllers.nginx_tuner.sweep import Measure, LoadMeasurer, Sweep, SweepSettings, summary_table, write_results
    from controllers.nginx_tuner.trial import LoadError

    prefix = args.nginx_prefix or args.nginx_config.parent
    if args.mode == "active" and not args.load_url:
        print(f"promreflex {TUNE}: --mode active needs --load.url", file=sys.stderr)
        return 2
    if wrong := problems(args):
        for line in wrong:
            print(f"promreflex {TUNE}: {line}", file=sys.stderr)
        return 2
    settings = SweepSettings(
        candidates=args.candidates, repeats=args.repeats, seed=args.seed, confidence=args.confidence, rule=args.rule,
        max_error_ratio=args.max_error_ratio, early_stop=args.early_stop, min_repeats=args.min_repeats, patience=args.patience,
    )
    registry = CollectorRegistry()
    ctl = NginxControl(args.nginx_config, prefix, args.nginx_binary, server_name=args.server_name,
                       health_url=args.health_url or (args.load_url if args.mode == "active" else None),
                       pid_path=args.nginx_pid_file, reload_timeout=args.reload_timeout)
    from controllers.nginx_tuner.config_edit import ConfigEditError
    from controllers.nginx_tuner.nginx_ctl import NginxError

    try:  # a sweep killed mid-way left a trial value: its original goes back first
        recovered = ctl.recover()
        # refused before any trial: an override below the tuned scope (the sweep would measure
        # the same effective value for every candidate), an ambiguous server name, a shared
        # snippet, a config that cannot be read
        ctl.check_tunable()
        current = _current(ctl)
    except (NginxError, ConfigEditError) as e:
        progress(f"promreflex {TUNE}: {e}")
        return 1
    if recovered:
        progress(f"an interrupted sweep's original: {recovered}")
    from urllib.parse import urlsplit

    host = urlsplit(args.load_url).hostname if args.mode == "active" and args.load_url else None
    if args.server_name and host and host.lower() != args.server_name.lower():
        # nginx picks a server by the Host header: a load URL by address reaches the port's default
        # server, which may be another (a review: 324 requests to blog, 0 to the tuned shop, and
        # the sweep still decided). No Host override yet: said, so that it is not measured blind.
        progress(f"warning: the load URL's host {host} is not {args.server_name}: nginx sends its requests to the "
                 f"default server of that port, which is {args.server_name} only if it is that port's default_server "
                 f"(or its only server); else load http://{args.server_name}:PORT/ (the name resolving to this "
                 "nginx, e.g. in /etc/hosts)")
    metrics = TunerMetrics(sorted({*settings.candidates, *([current] if current is not None else [])}),
                           registry=registry)
    ctl.metrics = metrics
    if current is not None:
        metrics.set_applied(current)

    def apply(value: float) -> ApplyResult:
        return ctl.apply(int(value))  # the sweep passes whole seconds

    async def go(measure: Measure) -> int:
        sweep = Sweep(settings, apply, measure, current, metrics=metrics, progress=progress, journal=ctl)
        # SIGTERM (systemctl stop, timeout, kill) cancels like Ctrl-C: the sweep puts the
        # pre-sweep file back and makes it live before the process ends.
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            result = await sweep.run()
        except LoadError as e:  # (the measurement's preflight: nothing was changed)
            progress(f"promreflex {TUNE}: not starting the sweep, nothing changed: {e}")
            return 1
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
        result.load_average = os.getloadavg()
        paths = write_results(result, args.results_dir, title=f"keepalive_timeout sweep ({args.mode})")
        progress("\n" + summary_table(result))
        progress("results: " + ", ".join(str(p) for p in paths.values()))
        return 0 if result.final_ok and result.choice is not None else 1

    import contextlib

    from promreflex.httpd import metrics_app, serving

    async with contextlib.AsyncExitStack() as stack:
        if args.listen_address:
            await stack.enter_async_context(serving(args.listen_address, metrics_app(registry, "promreflex tune-nginx")))
        if args.mode == "active":
            active = LoadMeasurer(ctl, args.load_url, users=args.users, spawn_rate=args.spawn_rate, duration_s=args.duration,
                                   think_min=args.think_min, think_max=args.think_max, stub_status_url=args.stub_status_url)
            return await go(active)
        import aiohttp

        from controllers.nginx_tuner.passive import DEFAULT_MEMORY_QUERY, PassiveMeasurer
        from promreflex.clients import PrometheusClient

        async with aiohttp.ClientSession() as session:
            passive = PassiveMeasurer(PrometheusClient(args.prometheus_url, session), site=args.site, dwell_s=args.dwell,
                                      settle_s=args.settle, memory_query=args.memory_query or DEFAULT_MEMORY_QUERY,
                                      max_error_ratio=args.max_error_ratio, min_requests=args.min_requests)
            return await go(passive)


def cmd_tune(args: argparse.Namespace) -> int:
    from controllers.nginx_tuner.config_edit import ConfigEditError
    from controllers.nginx_tuner.nginx_ctl import NginxError

    try:
        return asyncio.run(run_tune(args))
    except asyncio.CancelledError:  # SIGTERM: the sweep restored what it had changed
        return 128 + signal.SIGTERM
    except (ConfigEditError, NginxError) as e:  # a config it cannot work with: one line, no traceback
        print(f"promreflex {TUNE}: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"promreflex {TUNE}: {e}", file=sys.stderr)
        return 2


def add_exporter_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nginx.pid-file", dest="pid_file", type=Path, required=True,
                   help="pid file of the nginx master whose memory (PSS of master and workers) is exported")
    p.add_argument("--web.listen-address", dest="listen_address", default="127.0.0.1:9114",
                   help="where /metrics is served (default 127.0.0.1:9114)")


async def _serve_memory(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from controllers.nginx_tuner.memory import NginxMemoryCollector
    from promreflex.httpd import metrics_app, serving, stop_on_signals

    registry = CollectorRegistry()
    NginxMemoryCollector(args.pid_file, registry=registry)
    stop = stop_on_signals()
    try:
        async with serving(args.listen_address, metrics_app(registry, "promreflex nginx memory exporter")):
            await stop.wait()
    except OSError as e:
        print(f"promreflex {EXPORTER}: cannot listen on {args.listen_address}: {e.strerror}", file=sys.stderr)
        return 1
    return 0


def cmd_exporter(args: argparse.Namespace) -> int:
    return asyncio.run(_serve_memory(args))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tune-nginx`` and ``exporter-nginx-memory`` to a ``promreflex`` CLI."""
    p = subparsers.add_parser(TUNE, help="sweep nginx keepalive_timeout and apply the Pareto choice safely",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_tune_arguments(p)
    p.set_defaults(func=cmd_tune)
    e = subparsers.add_parser(EXPORTER, help="export nginx memory (PSS over master and workers)")
    add_exporter_arguments(e)
    e.set_defaults(func=cmd_exporter)
