"""``promreflex copy-guard doctor``: check every link of the copy guard's chain on a live system
and say what is missing, one line per link; exit 1 when a link is broken.

The chain, in the order a signal travels::

    nginx (site, stub_status) -> access log (growing, promreflex format) -> exporters up and
    scraped by Prometheus now (their jobs among its active targets: a target removed from
    scrape_configs leaves its last samples, `up` 1 included, in every query for 5 minutes)
    -> copy-guard rules loaded -> threshold published and sane -> demand
    (quiet now?) -> Alertmanager routes the copy-guard alerts to the controller's receiver with
    its token -> controller reachable (token accepted, copy-guard route) -> registry usable ->
    copies registered

Each line is ``OK``, ``WARN`` (works, but something will bite) or ``FAIL`` (broken: the guard
cannot pause a copy), then the link and what was found or what to do. Links that depend on a
broken one are still checked where they can be (a dead Prometheus does not stop the nginx
checks). The defaults come from the configuration (``--config.file``: the local stack's, or
``stack.nginx`` for an nginx that already runs); every address can be given by a flag, so it
checks a hand-built installation too (README "Guard a shop you already run"): with every address
given by flag it looks for no stack, and the ``calibrate`` command it suggests carries the shop,
the Prometheus and the site it checked, and ``--textfile.dir`` (the directory your node_exporter
serves: give it to the doctor, else the command says to fill it in).

The doctor sends one request to the site (to see the access log grow) and one to stub_status;
both are our own traffic, not demand (the rules subtract the exporter's scrapes; one request is
below any demand floor). A redirect is an answer: the doctor reports its status and Location and
does not follow it (to another host or scheme: a WARN, the guard must watch the server block that
serves the shop). Its first lines name every address and the stack directory the defaults come
from (a relative ``stack.state_dir``, the default, is under the current directory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from controllers.copy_guard.throttle import QUIET_RATIO

OK, WARN, FAIL = "OK", "WARN", "FAIL"
ALERTS = ("CopyGuardSiteOverloaded", "CopyGuardSiteOverloadPredicted")
# In the shipped route since issue 16's fifth bench: without it the guard still works (a WARN),
# but it answers a flash crowd only once the served rate has fallen.
CROWD_ALERT = "CopyGuardSiteCrowded"
RULE_GROUPS = ("copy-guard.rules", "copy-guard.alerts")
OWN_AGENTS = ("NGINX-Prometheus-Exporter", "nginx-prometheus-exporter")
HTTP_TIMEOUT = 5.0
#: A threshold sample older than this is not served any more (node_exporter is scraped every 15-60 s).
THRESHOLD_STALE_S = 150.0


@dataclass
class Check:
    status: str
    link: str
    detail: str


@dataclass
class Target:
    """Where each link is, from the configuration and the flags."""

    site: str
    site_url: str
    stub_status_url: str
    access_log: Path
    prometheus_url: str
    alertmanager_url: str
    controller_url: str
    token_file: Path | None
    registry_dir: Path | None
    min_floor: float
    extra: dict[str, Any] = field(default_factory=dict)
    # The local stack, when the configuration's stack runs: its exporters are its components,
    # so a missing series has a known cause (not running, not scraped yet) and a known fix.
    stack_dir: Path | None = None
    stack_alive: dict[str, int] = field(default_factory=dict)
    stack_dead: list[str] = field(default_factory=list)
    stack_started: float | None = None  # Unix s
    probe_at: float | None = None  # when check_access_log sent its request to the site
    # The other Alertmanager peers and Prometheus replicas the controller is configured with:
    # their routes and rules are checked too (one peer left with an old configuration passed as
    # "every link works": a stranger's cluster).
    other_alertmanagers: list[str] = field(default_factory=list)
    other_prometheus: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- HTTP
class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is the answer of the server asked (it is what nginx logged), not a request to
    send elsewhere: following it would talk to another host (the public one, a CDN, a name that
    does not resolve here) and blame the nginx named for its failures."""

    def redirect_request(self, *_args: Any, **_kw: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError: returned by http_fetch


_OPENER = urllib.request.build_opener(_NoRedirect)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an http(s) address (None: it can)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as e:
        return f"{url} is not a URL ({e})"
    if parts.scheme in ("http", "https") and parts.netloc:
        return None
    if "://" in url:
        return f"{url} is not an http:// or https:// URL"
    return f"{url} has no scheme: the URL needs http:// (http://{url})"


def http_fetch(url: str, token: str | None = None,
               timeout: float = HTTP_TIMEOUT) -> tuple[int, bytes, float, str | None]:
    """(status, body, seconds, Location); an HTTP error status is returned, not raised, and a
    redirect is not followed."""
    problem = url_problem(url)
    if problem:
        raise ValueError(problem)
    req = urllib.request.Request(url, headers={"User-Agent": "promreflex-doctor",  # noqa: S310 - the user's URLs
                                               **({"Authorization": f"Bearer {token}"} if token else {})})
    t0 = time.monotonic()
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return resp.status, resp.read(1 << 20), time.monotonic() - t0, resp.headers.get("Location")
    except urllib.error.HTTPError as e:
        location = e.headers.get("Location") if e.headers is not None else None
        return e.code, e.read(1 << 16), time.monotonic() - t0, location


def http_get(url: str, token: str | None = None, timeout: float = HTTP_TIMEOUT) -> tuple[int, bytes, float]:
    """(status, body, seconds); an HTTP error status is returned, not raised; a redirect is not
    followed (its 3xx is the status)."""
    status, body, seconds, _ = http_fetch(url, token, timeout)
    return status, body, seconds


def _why(e: BaseException) -> str:
    reason = getattr(e, "reason", None)
    return str(reason if reason is not None else e)


def prom_query(prom: str, expr: str) -> list[tuple[dict[str, str], float]]:
    from controllers.copy_guard.calibrate import prometheus_instant

    return prometheus_instant(prom, expr, timeout=HTTP_TIMEOUT)


# ---------------------------------------------------------------------------- the links
def _origin(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


def check_site(t: Target) -> Check:
    problem = url_problem(t.site_url)
    if problem:
        return Check(FAIL, "nginx", f"{problem}: fix stack.nginx.url / --nginx.url")
    try:
        status, _, s, location = http_fetch(t.site_url)
    except (OSError, ValueError) as e:
        return Check(FAIL, "nginx", f"{t.site_url} does not answer ({_why(e)}): is nginx running, is the URL right "
                     "(stack.nginx.url / --nginx.url)?")
    if 300 <= status < 400:
        answer = f"{t.site_url} answers {status} -> {location or '(no Location)'} ({s * 1000:.0f} ms, not followed)"
        target = urllib.parse.urljoin(t.site_url, location) if location else None
        if target is None or _origin(target) == _origin(t.site_url):
            return Check(OK, "nginx", answer)
        return Check(WARN, "nginx", f"{answer}: that server block only redirects to another host or scheme; the guard "
                     "must watch the one that serves the shop: give its URL (stack.nginx.url / --nginx.url) and "
                     "its access log (stack.nginx.access_log / --nginx.access-log)")
    if status >= 500:
        return Check(WARN, "nginx", f"{t.site_url} answers {status} ({s * 1000:.0f} ms): the shop behind nginx fails")
    return Check(OK, "nginx", f"{t.site_url} answers {status} ({s * 1000:.0f} ms)")


def parse_stub_status(text: str) -> dict[str, int]:
    """nginx's stub_status page -> active, accepts, handled, requests, reading, writing, waiting."""
    lines = [ln.split() for ln in text.strip().splitlines()]
    try:
        active = int(lines[0][2])
        accepts, handled, requests = (int(x) for x in lines[2][:3])
        rest = lines[3]
        return {"active": active, "accepts": accepts, "handled": handled, "requests": requests,
                "reading": int(rest[1]), "writing": int(rest[3]), "waiting": int(rest[5])}
    except (IndexError, ValueError):
        raise ValueError("not an nginx stub_status page") from None


def _stub_location(t: Target) -> str:
    path = urllib.parse.urlsplit(t.stub_status_url).path or "/stub_status"
    return f"`location = {path} {{ stub_status; access_log off; allow 127.0.0.1; deny all; }}`"


def check_stub_status(t: Target) -> Check:
    problem = url_problem(t.stub_status_url)
    if problem:
        return Check(FAIL, "stub_status", f"{problem}: fix stack.nginx.stub_status_url / --nginx.stub-status-url")
    try:
        status, body, _, location = http_fetch(t.stub_status_url)
    except (OSError, ValueError) as e:
        return Check(FAIL, "stub_status", f"{t.stub_status_url} does not answer ({_why(e)}): nginx must listen there, "
                     f"with {_stub_location(t)} in that server block (README)")
    if status == 404:
        return Check(FAIL, "stub_status", f"{t.stub_status_url} answers 404: no such location in that server block; "
                     f"add {_stub_location(t)} and reload nginx")
    if status == 403:
        return Check(FAIL, "stub_status", f"{t.stub_status_url} answers 403: that location denies this host; allow the "
                     "address the nginx exporter and this doctor connect from")
    if 300 <= status < 400:
        return Check(FAIL, "stub_status", f"{t.stub_status_url} answers {status} -> {location or '(no Location)'}, not "
                     "the stub_status page: give a URL that serves it without a redirect "
                     f"(--nginx.stub-status-url / stack.nginx.stub_status_url), a {_stub_location(t)}")
    if status != 200:
        return Check(FAIL, "stub_status", f"{t.stub_status_url} answers {status}, not the stub_status page "
                     f"({_stub_location(t)})")
    try:
        s = parse_stub_status(body.decode("utf-8", "replace"))
    except ValueError as e:
        return Check(FAIL, "stub_status", f"{t.stub_status_url}: {e} (the location needs `stub_status;`)")
    return Check(OK, "stub_status", f"{t.stub_status_url}: {s['requests']} requests so far, {s['writing']} writing")


#: The status field of a request line ("GET /x HTTP/1.1" 200 ...) when it is a 2xx or 3xx.
_SERVED = re.compile(r'" [23]\d\d ')


def _file_kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "not a regular file")


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return -1  # gone (rotated) while the doctor waits: the checks below say so


def check_access_log(t: Target, wait_s: float = 3.0) -> list[Check]:
    p = t.access_log
    try:  # stat first: a directory, a FIFO or a device is never opened (a FIFO's open blocks)
        mode = p.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        return [Check(FAIL, "access log", f"{p} cannot be looked at ({_why(e)}): the access-log exporter runs as uid "
                      f"{os.geteuid()} and must reach it")]
    if mode is None:
        return [Check(FAIL, "access log", f"{p} does not exist: nginx must write it (an `access_log {p} promreflex;` line "
                      "in the shop's server block, README)")]
    if not stat.S_ISREG(mode):
        return [Check(FAIL, "access log", f"{p} is {_file_kind(mode)}, not a file: give the file nginx writes (the path "
                      "of the shop's `access_log ... promreflex;` line) to --nginx.access-log / stack.nginx.access_log")]
    if not os.access(p, os.R_OK):
        return [Check(FAIL, "access log", f"{p} is not readable by uid {os.geteuid()}: the access-log exporter runs as this "
                      "user (e.g. add it to group adm, or run the stack as root)")]
    size = _size(p)
    problem = url_problem(t.site_url)
    t.probe_at = time.time()
    if problem is None:
        try:
            http_get(t.site_url)
        except (OSError, ValueError):
            pass  # the nginx line says so
        deadline = time.monotonic() + wait_s
        while _size(p) == size and time.monotonic() < deadline:
            time.sleep(0.1)
    out = []
    if problem is not None:
        out.append(Check(FAIL, "access log", f"{p} not tested: no request could be sent ({problem})"))
    elif _size(p) == size:
        out.append(Check(FAIL, "access log", f"{p} did not grow after a request to {t.site_url}: that server block logs "
                         "elsewhere (or buffers: drop `buffer=` from its access_log)"))
    from exporters.accesslog.preflight import tail_lines, timed_matcher

    try:
        lines = tail_lines(p, 64 << 10)[-200:]
    except OSError as e:
        return [*out, Check(FAIL, "access log", f"{p} cannot be read ({_why(e)})")]
    if not lines:
        return out or [Check(FAIL, "access log", f"{p} is empty")]
    matches = timed_matcher()
    bad = [ln for ln in lines if not matches(ln)]
    if len(bad) == len(lines):
        out.append(Check(FAIL, "log format", f"none of the last {len(lines)} lines of {p} is in the promreflex format "
                         f"(`log_format promreflex ...`, README); last line: {lines[-1][:120]!r}"))
    elif bad:
        out.append(Check(WARN, "log format", f"{len(bad)} of the last {len(lines)} lines of {p} do not parse (other "
                         f"formats in the same file?): {bad[-1][:120]!r}"))
    else:
        out.append(Check(OK, "log format", f"the last {len(lines)} lines of {p} are in the promreflex format"))
    stub_path = urllib.parse.urlsplit(t.stub_status_url).path or "/stub_status"
    # by its path, unless that is "/" (a stub_status on a port of its own, whose location is the
    # root: every visitor's `GET /` of the shop would look like a scrape), else by the exporter's agent
    by_path = stub_path != "/"
    own = [ln for ln in lines
           if ((by_path and (f" {stub_path} " in ln or f" {stub_path}?" in ln)) or any(a in ln for a in OWN_AGENTS))
           and _SERVED.search(ln)]  # a 404 or 403 there is not counted as served
    recent = [ln for ln in own if (at := _line_time(ln)) is None or at >= time.time() - OWN_TRAFFIC_RECENT_S]
    if recent:
        # a FAIL, not a warning: at the stack's 200 ms scrape that is 5 "served" requests a second
        # that no visitor asked for, in the served rate the threshold is compared with
        out.append(Check(FAIL, "own traffic", f"{len(recent)} of the last {len(lines)} lines of {p} are stub_status "
                         "scrapes answered 2xx: they count as served requests; add `access_log off;` to the "
                         "stub_status location"))
    elif own:
        # Only old ones: fixed since (on a quiet shop they stay among the last lines for hours,
        # and the doctor kept failing a fix already in place: a stranger's review).
        newest = max(when for ln in own if (when := _line_time(ln)) is not None)
        out.append(Check(OK, "own traffic", f"no stub_status scrape logged in the last {OWN_TRAFFIC_RECENT_S / 60:.0f} "
                         f"minutes ({len(own)} older ones, the newest at "
                         f"{time.strftime('%H:%M:%S', time.localtime(newest))}: fixed since)"))
    if not any(c.link == "access log" for c in out):
        out.insert(0, Check(OK, "access log", f"{p} is readable and grows"))
    return out


#: stub_status scrapes logged longer ago than this are taken for a mistake fixed since.
OWN_TRAFFIC_RECENT_S = 120.0
_TIME_LOCAL = re.compile(r"\[(\d{2}/[A-Za-z]{3}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4})\]")


def _line_time(line: str) -> float | None:
    """The Unix time of a log line's ``[$time_local]``, or None."""
    m = _TIME_LOCAL.search(line)
    if m is None:
        return None
    try:
        return datetime.strptime(m.group(1), "%d/%b/%Y:%H:%M:%S %z").timestamp()
    except ValueError:
        return None


#: (link, the stack's component, its scrape job, the series that proves it is scraped)
EXPORTERS = (("nginx exporter", "nginx_exporter", "nginx", "nginx_http_requests_total"),
             ("accesslog exporter", "accesslog_exporter", "accesslog", 'promreflex_http_requests_total{{site="{site}"}}'))
#: A stack started this recently may not be scraped yet: the doctor waits for its series.
FRESH_STACK_S = 60.0


def _stack_fix(t: Target, comp: str) -> str | None:
    """What is wrong with the stack's component ``comp`` and the fix, when the stack runs it."""
    if t.stack_dir is None:
        return None
    if comp in t.stack_dead:
        return (f"the stack's {comp} is not running (log {t.stack_dir / 'logs' / (comp + '.log')}): "
                f"`promreflex stack restart {comp}{t.extra.get('flags', '')}`")
    if comp in t.stack_alive:
        return (f"the stack's {comp} runs (pid {t.stack_alive[comp]}) but is not scraped: see "
                f"{t.prometheus_url}/targets and {t.stack_dir / 'logs' / (comp + '.log')}")
    return None


def _service_fix(t: Target, comp: str, flag: str, example: str) -> str:
    """What to do when Prometheus or Alertmanager (the stack's component ``comp``) does not answer."""
    dead = _stack_fix(t, comp) if comp in t.stack_dead else None
    if dead:
        return dead
    defaulted = t.extra.get("defaulted")
    if defaulted is not None and comp not in defaulted:  # the user's own, given by flag
        return f"is it running, and is {flag} its address?"
    return (f"is it running? Give the address of yours with {flag} (e.g. `{flag} {example}`), or start the "
            f"local stack's with `promreflex stack up{t.extra.get('flags', '')}`")


#: A series whose newest sample is older than this is not scraped any more (every supported
#: scrape interval is 1 min or less); Prometheus still answers it for its 5 min lookback.
SERIES_STALE_S = 120.0


def active_jobs(prom: str) -> set[str] | None:
    """The jobs of Prometheus' active targets (/api/v1/targets), or None when it does not say."""
    try:
        status, body, _ = http_get(f"{prom.rstrip('/')}/api/v1/targets?state=active")
        if status != 200:
            return None
        targets = json.loads(body)["data"]["activeTargets"]
        return {str(tg.get("labels", {}).get("job", "")) for tg in targets}
    except Exception:  # noqa: BLE001 - an older Prometheus, a proxy in front: the age check below
        return None


def not_scraped_yet(prom: str, job: str) -> str | None:
    """Job ``job``'s active targets that Prometheus has not scraped yet (health "unknown": just
    added, before their first scrape), said with their interval; None when there are none."""
    try:
        status, body, _ = http_get(f"{prom.rstrip('/')}/api/v1/targets?state=active")
        targets = json.loads(body)["data"]["activeTargets"] if status == 200 else []
    except Exception:  # noqa: BLE001 - the checks around stand
        return None
    waiting = [tg for tg in targets if str(tg.get("labels", {}).get("job", "")) == job and tg.get("health") == "unknown"]
    if not waiting:
        return None
    where = ", ".join(str(tg.get("labels", {}).get("instance", "?")) for tg in waiting)
    every = sorted({str(tg.get("scrapeInterval", "")) for tg in waiting} - {""})
    return (f"job {job} ({where}) is among Prometheus' targets but not scraped yet"
            + (f" (every {', '.join(every)})" if every else "") + ": run the doctor again after its first scrape")


def not_scraped(t: Target, metric: str, present: list[dict[str, str]], jobs: set[str] | None) -> str | None:
    """Why the series ``present`` (job, instance) of ``metric`` are not scraped NOW, or None. The
    last samples of a target dropped from scrape_configs stay in every instant query for 5
    minutes (and its `up` with them: Prometheus writes no staleness marker for a target removed
    by a reload), so a series that exists proves nothing: its job must be among the active
    targets, else (no targets API) its newest sample must be recent."""
    seen = sorted({lb.get("job", "") for lb in present})
    try:
        ages = {(lb.get("job", ""), lb.get("instance", "")): v for lb, v in
                prom_query(t.prometheus_url, f"time() - max by (job, instance) (timestamp({metric}))")}
    except Exception:  # noqa: BLE001
        ages = {}
    oldest = max((v for v in ages.values() if math.isfinite(v)), default=None)
    old = f", its last sample {_ago(oldest)} old" if oldest is not None else ""
    where = ", ".join(f"{lb.get('job')}/{lb.get('instance')}" for lb in present)
    if jobs is not None:
        gone = [j for j in seen if j not in jobs]
        if gone and len(gone) == len(seen):
            return (f"Prometheus does not scrape job {', '.join(gone)} now ({where}: not among its active targets, "
                    f"{t.prometheus_url}/targets{old}; Prometheus shows a removed target's last samples for 5 "
                    "minutes)")
        return None
    if ages and all(v > SERIES_STALE_S for v in ages.values()):
        return (f"Prometheus has not scraped {where} for {_ago(min(ages.values()))} (its last samples stay visible for "
                "5 minutes)")
    return None


def check_prometheus(t: Target, settle_s: float = 20.0) -> list[Check]:
    prom = t.prometheus_url
    try:
        prom_query(prom, "vector(1)")
    except Exception as e:  # noqa: BLE001 - any failure: one line
        return [Check(FAIL, "prometheus", f"{prom} does not answer queries ({_why(e)}): "
                      + _service_fix(t, "prometheus", "--prometheus.url", "http://127.0.0.1:9090"))]
    out = [Check(OK, "prometheus", f"{prom} answers")]
    site = t.site
    how = {"nginx_exporter": f"run prometheus-nginx-exporter -nginx.scrape-uri={t.stub_status_url} and add it to "
                             "scrape_configs as job nginx (README)",
           "accesslog_exporter": f"run `promreflex exporter-accesslog --log {site}={t.access_log}:nginx_timed` and add "
                                 "it to scrape_configs as job accesslog (README)"}
    fresh = t.stack_started is not None and time.time() - t.stack_started < FRESH_STACK_S
    jobs = active_jobs(prom)
    for link, comp, job, series in EXPORTERS:
        metric = series.format(site=site)
        try:
            present = prom_query(prom, f"group by (job, instance) ({metric})")
            if not present and fresh and comp in t.stack_alive:  # just started: its first scrapes
                deadline = time.monotonic() + settle_s
                while not present and time.monotonic() < deadline:
                    time.sleep(1.0)
                    present = prom_query(prom, f"group by (job, instance) ({metric})")
            down = [lb for lb, v in prom_query(prom, f'up{{job="{job}"}}') if v != 1]
        except Exception as e:  # noqa: BLE001
            out.append(Check(FAIL, link, f"query failed: {_why(e)}"))
            continue
        if comp == "nginx_exporter":
            try:  # the exporter drops its nginx_* series when it cannot read stub_status: nginx_up first
                blind = [lb for lb, v in prom_query(prom, f'nginx_up{{job="{job}"}}') if v != 1]
            except Exception:  # noqa: BLE001 - the checks below stand
                blind = []
            if blind:
                out.append(Check(FAIL, link, f"up, but it cannot read stub_status (nginx_up 0): {t.stub_status_url} "
                                 "must answer it (the stub_status line above)"))
                continue
        if down:
            where = ", ".join(lb.get("instance", "?") for lb in down)
            out.append(Check(FAIL, link, f"Prometheus cannot scrape job {job} ({where}: up 0)"
                             + (f"; {_stack_fix(t, comp)}" if comp in t.stack_dead else ": is the exporter running?")))
            continue
        if not present:
            # just added to a shop's own Prometheus: its first scrape is up to an interval away (a
            # stranger at 30 s was told to run exporters that were running)
            waiting = not_scraped_yet(prom, job)
            out.append(Check(WARN, link, waiting) if waiting else
                       Check(FAIL, link, f"Prometheus has no {metric}: {_stack_fix(t, comp) or how[comp]}"))
            continue
        gone = not_scraped(t, metric, [lb for lb, _ in present], jobs)
        if gone:
            out.append(Check(FAIL, link, f"{gone}: {_stack_fix(t, comp) or how[comp] + ', then reload Prometheus'}"))
            continue
        targets = ", ".join(f"{lb.get('job')}/{lb.get('instance')}" for lb, _ in present)
        if comp == "accesslog_exporter":
            out.append(check_exporter_reads(t, [lb for lb, _ in present], targets))
            continue
        out.append(Check(OK, link, f"scraped: {targets}"))
    return out


#: Set in :func:`_exporter_samples`' answer when nothing listens at a loopback exporter.
REFUSED = "promreflex_doctor_connection_refused"


def _exporter_samples(instance: str, site: str) -> dict[str, float] | None:
    """The access-log exporter's own /metrics for ``site``, summed by sample name (None: not
    reachable from here)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        status, body, _ = http_get(f"http://{instance}/metrics", timeout=2.0)
        if status != 200:
            return None
    except (OSError, ValueError) as e:
        host = instance.rsplit(":", 1)[0].strip("[]")
        refused = isinstance(e, ConnectionRefusedError) or isinstance(getattr(e, "reason", None), ConnectionRefusedError)
        # nothing listens there: on this host, the exporter is not running (Prometheus' last
        # scrape, up to an interval old, still says up: a reviewer killed it at a 60 s scrape and
        # was told every link works)
        loopback = host in ("localhost", "::1") or host.startswith("127.")
        return {REFUSED: 1.0} if refused and loopback else None
    try:
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(body.decode("utf-8", "replace")):
            for smp in fam.samples:
                if smp.labels.get("site") == site:
                    out[smp.name] = out.get(smp.name, 0.0) + smp.value
    except (OSError, ValueError):
        return None
    return out


def check_exporter_reads(t: Target, instances: list[dict[str, str]], targets: str, wait_s: float = 5.0) -> Check:
    """The access-log exporter read the line of the doctor's own request to the site (end to
    end: the right file, the right site label) and parses the log's lines. A series that exists
    proves only that the exporter runs: one following another file (its log moved, the stack's
    configuration changed without a restart) counts nothing and looked fine."""
    link = "accesslog exporter"
    if t.probe_at is None:
        return Check(OK, link, f"scraped: {targets}")
    addresses = [lb.get("instance", "") for lb in instances if lb.get("instance")]
    deadline = time.monotonic() + wait_s
    while True:
        results = {a: _exporter_samples(a, t.site) for a in addresses}
        refused = [a for a, p in results.items() if p is not None and REFUSED in p]
        pages = [p for p in results.values() if p is not None and REFUSED not in p]
        stamps = [p["promreflex_accesslog_last_line_timestamp_seconds"] for p in pages
                  if "promreflex_accesslog_last_line_timestamp_seconds" in p]
        last = max(stamps) if stamps else None
        if not pages or (last is not None and last >= t.probe_at - 1) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    if refused and not pages:
        return Check(FAIL, link, f"nothing listens at {', '.join(refused)}: the exporter is not running (Prometheus "
                     "still has its last scrape, up to an interval old)")
    if not pages:
        return Check(OK, link, f"scraped: {targets} (its /metrics not reachable from here: that it reads "
                     f"{t.access_log} is not checked)")
    lines = sum(p.get("promreflex_accesslog_lines_total", 0.0) for p in pages)
    errors = sum(p.get("promreflex_accesslog_parse_errors_total", 0.0) for p in pages)
    if last is None or last < t.probe_at - 1:
        ago = "has read no line of it" if last is None else f"last read a line {_ago(time.time() - last)} ago"
        restart = (f" (`promreflex stack reload{t.extra.get('flags', '')}` restarts it with the configuration's log)"
                   if t.stack_dir else "")
        try:
            private = not os.stat(t.access_log).st_mode & stat.S_IROTH
        except OSError:
            private = False
        perms = (f", or it cannot read {t.access_log} as its user (the file is not readable by others: a "
                 "rotation with `create 0640 www-data adm` leaves a `prometheus` user out; its log says "
                 "Permission denied)") if private else ""
        return Check(FAIL, link, f"scraped ({targets}) but it did not read the doctor's request to {t.site_url} from "
                     f"{t.access_log} within {wait_s:g}s (it {ago}): it follows another file or another site label "
                     f"than {t.site!r}{restart}{perms}")
    if lines > 0 and errors >= lines:
        return Check(FAIL, link, f"scraped ({targets}) and reading {t.access_log}, but it rejected every one of its "
                     f"{lines:.0f} lines (promreflex_accesslog_parse_errors_total): not the promreflex format")
    return Check(OK, link, f"scraped: {targets}; it read the doctor's request from {t.access_log}")


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def check_rules(t: Target) -> Check:
    try:
        _, body, _ = http_get(f"{t.prometheus_url.rstrip('/')}/api/v1/rules")
        groups = json.loads(body)["data"]["groups"]
    except Exception as e:  # noqa: BLE001
        return Check(FAIL, "rules", f"cannot read {t.prometheus_url}/api/v1/rules ({_why(e)})")
    names = {g["name"]: g for g in groups}
    missing = [g for g in RULE_GROUPS if g not in names]
    if missing:
        return Check(FAIL, "rules", f"groups {', '.join(missing)} not loaded: add rules/copy-guard.rules.yml to "
                     "rule_files and reload Prometheus")
    broken = [r.get("name") or r.get("record") for g in RULE_GROUPS for r in names[g]["rules"]
              if r.get("health") not in (None, "ok", "unknown")]
    if broken:
        return Check(FAIL, "rules", f"rules failing to evaluate: {', '.join(map(str, broken))}")
    alerts = {r.get("name") for r in names["copy-guard.alerts"]["rules"]}
    if not set(ALERTS) <= alerts:
        return Check(FAIL, "rules", f"alerts {', '.join(sorted(set(ALERTS) - alerts))} missing from copy-guard.alerts")
    interval = names["copy-guard.rules"].get("interval")
    return Check(OK, "rules", f"copy-guard rules loaded (evaluated every {interval:g}s)" if interval else "copy-guard rules loaded")


def calibrate_command(t: Target) -> str:
    """The ``promreflex calibrate`` that publishes the threshold where this doctor looked: the
    shop, the Prometheus and the site it checked, the configuration it read, and the textfile
    directory (``--textfile.dir``; the stack's when the addresses are the stack's, else a
    placeholder to fill in)."""
    import shlex

    textfile = t.extra.get("textfile_dir")
    parts = [f"promreflex calibrate --site {shlex.quote(t.site)}{t.extra.get('flags', '')}",
             f"--target {shlex.quote(t.site_url)}", f"--prometheus.url {shlex.quote(t.prometheus_url)}"]
    if textfile is not None:
        parts.append(f"--textfile.dir {shlex.quote(str(textfile))}")
    elif not t.extra.get("stack_textfile"):
        parts.append("--textfile.dir DIR")
    cmd = f"`{' '.join(parts)}`"
    if textfile is None and not t.extra.get("stack_textfile"):
        cmd += " (DIR: the directory your node_exporter's --collector.textfile.directory serves)"
    return cmd


def _one(prom: str, expr: str) -> float | None:
    values = [v for _, v in prom_query(prom, expr) if math.isfinite(v)]
    return max(values) if values else None


def check_threshold(t: Target) -> list[Check]:
    from controllers.copy_guard.calibrate import OWN_RPS_QUERY

    prom, site = t.prometheus_url, t.site
    try:
        thr = _one(prom, f'site:promreflex_copy_guard_threshold:rps{{site="{site}"}}')
        floor = _one(prom, f'site:promreflex_copy_guard_demand_floor:rps{{site="{site}"}}')
        response = _one(prom, f'site:promreflex_copy_guard_response_time:seconds{{site="{site}"}}')
        when = _one(prom, f'max(promreflex_copy_guard_calibration_timestamp_seconds{{site="{site}"}})')
        # the raw sample's time: a Prometheus restarted after the textfile was removed still
        # answers the previous process's sample for its 5 min lookback
        sampled = _one(prom, f'max(timestamp(promreflex_copy_guard_rps_threshold{{site="{site}"}}))')
        own = _one(prom, OWN_RPS_QUERY)
        served = _one(prom, f'site:promreflex_http_requests_served:rate1s{{site="{site}"}}')
        # what the alerts' gate compares with the floor (rules/copy-guard.rules.yml: "asked")
        demand = _one(prom, f'site:promreflex_copy_guard_asked:rps{{site="{site}"}}')
        firing = prom_query(prom, f'ALERTS{{alertname=~"{"|".join(ALERTS)}", site="{site}"}}')
    except Exception as e:  # noqa: BLE001
        return [Check(FAIL, "threshold", f"query failed: {_why(e)}")]
    if thr is None:
        return [Check(FAIL, "threshold", f"no threshold for site {site}: run {calibrate_command(t)} "
                      "(node_exporter must serve its textfile directory and be scraped)")]
    out = []
    problems = []
    if floor is None or floor < t.min_floor:
        problems.append(f"demand floor {floor if floor is None else round(floor, 2)} is below the sane lowest "
                        f"{t.min_floor:g} req/s: our own traffic could open the gate")
    if thr < 2 * t.min_floor:
        problems.append(f"threshold {thr:.2f} req/s is below {2 * t.min_floor:g}: indistinguishable from an idle shop")
    if own is not None and floor is not None and floor <= own:
        problems.append(f"floor {floor:.2f} is at or below the exporters' own {own:.2f} req/s")
    age = time.time() - when if when else None
    detail = (f"{thr:.2f} req/s, floor {floor if floor is None else round(floor, 2)}"
              + (f", healthy response time {response * 1000:.0f} ms" if response is not None else "")
              + (f", calibrated {_ago(age)} ago" if age is not None else ""))
    stale = time.time() - sampled if sampled is not None else None
    if stale is not None and stale > THRESHOLD_STALE_S:
        return [Check(FAIL, "threshold", f"{detail}: its last sample is {_ago(stale)} old, node_exporter no longer "
                      f"serves it (its textfile removed, or node_exporter not scraped): {calibrate_command(t)} "
                      "publishes it again")]
    if problems:
        out.append(Check(FAIL, "threshold", f"{detail}: " + "; ".join(problems) + " (calibrate again)"))
    elif response is None:
        out.append(Check(WARN, "threshold", f"{detail}: no healthy response time "
                         "(promreflex_copy_guard_response_time_seconds): requests in flight count 1 req/s each, so a "
                         "stall whose visitors wait instead of arriving is not seen; "
                         "calibrate again"))
    elif age is not None and age > 30 * 86400:
        out.append(Check(WARN, "threshold", f"{detail}: older than 30 days, the shop has changed since; calibrate again"))
    else:
        out.append(Check(OK, "threshold", detail))
    states = sorted({f"{lb.get('alertname')} {lb.get('alertstate')}" for lb, _ in firing})
    now = (f"served {served if served is None else round(served, 2)} req/s, asked "
           f"{demand if demand is None else round(demand, 2)} req/s"
           + (f" (nginx exporters' own requests {own:.2f} req/s, not counted)" if own is not None else ""))
    if served is None:
        out.append(Check(FAIL, "signal", f"no served rate for site {site}: CopyGuardSignalMissing; check the exporters"))
    else:
        # the throttle's words (throttle.judge): quiet under QUIET_RATIO x the floor, light under it
        level = ("busy" if demand is None or floor is None or demand >= floor else
                 "quiet, copies run at full speed" if demand < QUIET_RATIO * floor else
                 "light (under the floor), copies run")
        out.append(Check(OK, "demand", f"{now}: {level}" + (f"; {', '.join(states)}" if states else "")))
    return out


def _amtool_receivers(am: str, labels: dict[str, str]) -> list[str] | None:
    amtool = shutil.which("amtool")
    if amtool is None:
        return None
    cmd = [amtool, f"--alertmanager.url={am}", "config", "routes", "test", *(f"{k}={v}" for k, v in labels.items())]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=15, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return [r.strip() for r in res.stdout.replace(",", " ").split() if r.strip()]


def _routes(route: dict[str, Any]) -> list[dict[str, Any]]:
    """Every route of an Alertmanager routing tree, depth first."""
    out = [route]
    for child in route.get("routes") or []:
        if isinstance(child, dict):
            out.extend(_routes(child))
    return out


def alert_labels(t: Target) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The copy-guard alerts' labels as Prometheus loaded their rules (``/api/v1/rules``), and
    its ``external_labels`` (``/api/v1/status/config``); empty where it does not answer."""
    import yaml

    base = t.prometheus_url.rstrip("/")
    rules: dict[str, dict[str, str]] = {}
    external: dict[str, str] = {}
    try:
        _, body, _ = http_get(f"{base}/api/v1/rules?type=alert")
        for group in json.loads(body)["data"]["groups"]:
            for rule in group.get("rules") or []:
                if rule.get("name") in (*ALERTS, CROWD_ALERT):
                    rules[rule["name"]] = {str(k): str(v) for k, v in (rule.get("labels") or {}).items()}
    except Exception:  # noqa: BLE001 - check_rules says what is wrong with the rules
        rules = {}
    try:
        _, body, _ = http_get(f"{base}/api/v1/status/config")
        config = yaml.safe_load(json.loads(body)["data"]["yaml"]) or {}
        external = {str(k): str(v) for k, v in ((config.get("global") or {}).get("external_labels") or {}).items()}
        external = _alert_relabel(external, (config.get("alerting") or {}).get("alert_relabel_configs") or [])
    except Exception:  # noqa: BLE001 - check_prometheus says what is wrong with Prometheus
        external = {}
    return rules, external


def _alert_relabel(labels: dict[str, str], configs: list[Any]) -> dict[str, str]:
    """``labels`` after the simple steps of Prometheus' ``alert_relabel_configs`` (applied after
    external labels, before sending): a label set to a constant (``replace`` with no source
    labels), and ``labeldrop``/``labelkeep`` of the labels known here. Other steps depend on an
    alert's own labels and are left out (a review: `target_label: env, replacement: prod` sent
    every copy-guard alert to a route on env="prod" while the doctor said OK)."""
    import re as re_mod

    out = dict(labels)
    for c in configs:
        if not isinstance(c, dict):
            continue
        action = str(c.get("action", "replace")).lower()
        if action == "replace" and not c.get("source_labels") and c.get("target_label"):
            out[str(c["target_label"])] = str(c.get("replacement", "$1")).replace("$1", "")
        elif action in ("labeldrop", "labelkeep") and c.get("regex"):
            rx = re_mod.compile(f"(?:{c['regex']})")
            keep = action == "labelkeep"
            out = {k: v for k, v in out.items() if bool(rx.fullmatch(k)) == keep}
    return out


def check_alertmanager(t: Target) -> list[Check]:
    import yaml

    am = t.alertmanager_url
    try:
        _, body, _ = http_get(f"{am.rstrip('/')}/api/v2/status")
        config = yaml.safe_load(json.loads(body)["config"]["original"])
    except Exception as e:  # noqa: BLE001
        return [Check(FAIL, "alertmanager", f"{am} does not answer /api/v2/status ({_why(e)}): "
                      + _service_fix(t, "alertmanager", "--alertmanager.url", "http://127.0.0.1:9093"))]
    webhook = f"{t.controller_url.rstrip('/')}/webhook"
    receivers = {r["name"]: r for r in config.get("receivers") or []}
    ours = [name for name, r in receivers.items()
            if any(w.get("url", "").rstrip("/") == webhook for w in r.get("webhook_configs") or [])]
    if not ours:
        return [Check(FAIL, "alertmanager", f"no receiver posts to {webhook}: add the promreflex receiver (README step 3)")]
    out = []
    # The labels each alert really carries: its rule's as Prometheus loaded them (severity: the
    # doctor tested OverloadPredicted as a warning, the rule says info) and Prometheus'
    # external_labels, which it adds to every alert it sends (a route on `monitor="shop-prod"`
    # above ours took the alerts while the doctor said every link works: a stranger's review, R2/R7).
    rule_labels, external = alert_labels(t)
    has_sub_route = any(r.get("receiver") in ours for r in _routes(config.get("route") or {}))
    for alert in (*ALERTS, CROWD_ALERT):
        labels = {**external, **rule_labels.get(alert, {"severity": "info" if alert != ALERTS[0] else "warning"}),
                  "alertname": alert, "site": t.site}
        got = _amtool_receivers(am, labels)
        shown = ",".join(f"{k}={v}" for k, v in labels.items() if k != "alertname")
        if got is None:
            out.append(Check(WARN, "route", f"amtool missing or failed: cannot test where {alert} goes"))
        elif not set(got) & set(ours):
            fix = ("a route above the promreflex sub-route catches it and has no `continue: true`: give that route "
                   "`continue: true`, or put the sub-route first" if has_sub_route else
                   "add a sub-route with `continue: true` (README step 3)")
            if alert == CROWD_ALERT:
                fix += " (the shipped route pauses copies for a flash crowd from its first scrape)"
            out.append(Check(FAIL, "route", f"{alert}{{{shown}}} goes to {', '.join(got) or 'nothing'}, not "
                             f"{', '.join(ours)}: {fix}"))
        else:
            out.append(Check(OK, "route", f"{alert}{{{shown}}} -> {', '.join(got)}"))
    token_issue = _receiver_token(receivers, ours, webhook, t.token_file)
    out.append(token_issue)
    return out


def _receiver_token(receivers: dict[str, Any], ours: list[str], webhook: str, token_file: Path | None) -> Check:
    from promreflex.httpd import read_token_file

    for name in ours:
        for w in receivers[name].get("webhook_configs") or []:
            if w.get("url", "").rstrip("/") != webhook:
                continue
            auth = (w.get("http_config") or {}).get("authorization") or {}
            if not auth:
                return Check(FAIL, "token", f"receiver {name} sends no `http_config.authorization`: the controller "
                             "answers 401 when it requires a token")
            path = auth.get("credentials_file")
            if path is None:
                return Check(WARN, "token", f"receiver {name} has an inline credential (not checkable here; a "
                             "credentials_file is safer)")
            if token_file is None:
                return Check(WARN, "token", f"receiver {name} reads {path}; --token-file not given, not compared")
            try:
                mine = read_token_file(token_file)
                theirs = Path(path).read_text().strip()
            except Exception as e:  # noqa: BLE001 - another user's file, a path inside a container
                return Check(WARN, "token", f"receiver {name} reads {path}; cannot compare it here ({_why(e)})")
            if theirs != mine:
                return Check(FAIL, "token", f"receiver {name}'s {path} does not hold the controller's token ({token_file})")
            return Check(OK, "token", f"receiver {name} sends the controller's token ({path})")
    return Check(FAIL, "token", "no receiver found")


def check_controller(t: Target) -> list[Check]:
    from promreflex.httpd import read_token_file

    base = t.controller_url.rstrip("/")
    try:
        status, _, _ = http_get(f"{base}/-/ready")
    except (OSError, ValueError) as e:
        return [Check(FAIL, "controller", f"{base} does not answer ({_why(e)}): is `promreflex controller` running?")]
    if status != 200:
        return [Check(FAIL, "controller", f"{base}/-/ready answers {status}")]
    out = [Check(OK, "controller", f"{base} ready")]
    try:
        token = read_token_file(t.token_file) if t.token_file else None
    except Exception as e:  # noqa: BLE001 - UserError from the token checks
        out.append(Check(FAIL, "controller token", str(e)))
        token = None
    try:
        status, _, _ = http_get(f"{base}/api/v1/state", token)
        _, metrics, _ = http_get(f"{base}/metrics")
    except (OSError, ValueError) as e:
        return [*out, Check(FAIL, "controller", f"{base}: {_why(e)}")]
    if status == 401:
        out.append(Check(FAIL, "controller token", f"{base} refuses the token of {t.token_file} (401)"))
    elif status == 200:
        out.append(Check(OK, "controller token", "accepted" if token else "none required (loopback)"))
    has_route = 'action="copy-guard"' in metrics.decode("utf-8", "replace")
    unreachable = t.extra.get("route_warnings") or []
    if has_route and unreachable:  # (a stranger's typo: the controller took the webhooks and did nothing)
        out.append(Check(FAIL, "controller route", "; ".join(unreachable)))
    else:
        out.append(Check(OK if has_route else FAIL, "controller route",
                         "a route runs the copy-guard action" if has_route else
                         "no route runs the copy-guard action: add it to controller.routes (README step 4), then "
                         "reload"))
    return out


def _route_warnings(controller: Any) -> list[str]:
    """The configuration's copy-guard routes that let none of the copy-guard alerts through
    (``controllers.cli.unreachable_routes``); a configuration the controller refuses is said by
    ``check-config``, not here."""
    from controllers.cli import unreachable_routes
    from controllers.engine import bind_routes

    try:
        return unreachable_routes(bind_routes(controller))
    except Exception:  # noqa: BLE001 - check-config's business
        return []


def check_registry(t: Target) -> list[Check]:
    from controllers.copy_guard.registry import Registry, check_dir, default_dir
    from promreflex.errors import UserError

    d = t.registry_dir or default_dir()
    try:
        check_dir(d)
    except UserError as e:
        return [Check(FAIL, "registry", str(e))]
    if not d.exists():
        return [Check(WARN, "registry", f"{d} does not exist yet (the first `promreflex copy` or adopt creates it); "
                      "nothing is registered")]
    if not os.access(d, os.W_OK | os.X_OK):
        return [Check(FAIL, "registry", f"{d} is not writable by uid {os.geteuid()}")]
    entries = [e for e in Registry(d).entries() if e.site == t.site]
    if not entries:
        return [Check(OK, "registry", f"{d} usable"),
                Check(WARN, "copies", f"no copy registered for site {t.site}: start one with `promreflex copy` or "
                      "`promreflex copy-guard adopt --pid N`")]
    return [Check(OK, "registry", f"{d} usable"),
            Check(OK, "copies", f"{len(entries)} registered for {t.site}: " + ", ".join(e.id for e in entries[:5]))]


def run_checks(t: Target, wait_s: float = 3.0) -> list[Check]:
    """Every link, in the order of the chain."""
    note = [Check(WARN, "stack", t.extra["stack_note"])] if t.extra.get("stack_note") else []
    return [*note, check_site(t), check_stub_status(t), *check_access_log(t, wait_s), *check_prometheus(t),
            check_rules(t), *_others(t, "other_prometheus", "prometheus_url", lambda o: [check_rules(o)]),
            *check_threshold(t), *check_alertmanager(t),
            *_others(t, "other_alertmanagers", "alertmanager_url", check_alertmanager),
            *check_controller(t), *check_registry(t)]


def _others(t: Target, field_name: str, url_field: str, check: Callable[[Target], list[Check]]) -> list[Check]:
    """``check`` run on each other peer or replica: what fails is shown with the server's name,
    what passes is one line per server."""
    out: list[Check] = []
    for url in getattr(t, field_name):
        got = check(replace(t, **{url_field: url}))
        bad = [c for c in got if c.status != OK]
        out += [Check(c.status, c.link, f"{url}: {c.detail}") for c in bad] or [
            Check(OK, got[0].link if got else "peer", f"{url}: the same ({len(got)} check(s) pass)")]
    return out


def render(checks: list[Check]) -> str:
    width = max(len(c.link) for c in checks)
    return "\n".join(f"{c.status:<5}{c.link:<{width + 2}}{c.detail}" for c in checks)


# ---------------------------------------------------------------------------- CLI
def target_from(args: argparse.Namespace) -> Target:
    """Flags first, then the configuration (the local stack's, or its ``stack.nginx`` external)."""
    from promreflex.config import DEFAULT_CONFIG, load_config
    from promreflex.stack import Stack

    overrides = {"stack.state_dir": str(args.state_dir)} if args.state_dir else {}
    cfg = load_config(args.config_file or DEFAULT_CONFIG, overrides)
    stack = Stack(cfg)
    ext = cfg.stack.nginx
    stub = str(ext.stub_status_url) if ext.external else stack.url("nginx_stub_status") + "/stub_status"
    c = cfg.controller
    routes = [r for r in c.routes if r.action == "copy-guard"]
    registry = routes[0].params.get("registry_dir") if routes else None
    alive = stack.running()
    running = bool(alive)
    site = args.site or getattr(getattr(cfg, "accesslog", None), "site", "shop")
    started = stack.record().get("started") if running else None
    # the flags that find this configuration again, for the commands our fixes name
    flags = f" --config.file {args.config_file}" if args.config_file else (
        f" --state.dir {args.state_dir}" if args.state_dir else "")
    extra: dict[str, Any] = {"flags": flags, "stack_dir": stack.dir, "stack_running": running,
                             # stack.state_dir relative: under the current directory
                             "stack_dir_from_cwd": not args.state_dir
                             and not cfg.stack.state_dir.expanduser().is_absolute()}
    # A file written for the stack: its addresses are the stack's, whether it runs or not (the
    # controller's defaults, 9090 and friends, could be another stack's or anyone's).
    stack_addresses = running or "stack" in cfg.model_fields_set or bool(args.state_dir)
    # the links whose address no flag gave: they come from the configuration (the stack's)
    defaulted = [link for link, flag in (("nginx", args.nginx_url), ("stub_status", args.stub_status_url),
                                         ("access log", args.access_log), ("prometheus", args.prometheus_url),
                                         ("alertmanager", args.alertmanager_url),
                                         ("controller", args.controller_url)) if not flag]
    extra["defaulted"] = defaulted
    if not running and stack_addresses and defaulted:
        extra["stack_note"] = (f"no stack runs from {stack.dir}: the address of {', '.join(defaulted)} below is the "
                               f"stack's and cannot answer; start it with `promreflex stack up{flags}`, or give "
                               "yours by flag (--help)")
    textfile_dir = getattr(args, "textfile_dir", None)
    extra["textfile_dir"] = textfile_dir
    # calibrate's default textfile directory (from the same flags) is the stack's: right when the
    # Prometheus checked is the stack's too (its node_exporter serves that directory)
    extra["stack_textfile"] = stack_addresses and not args.prometheus_url
    extra["route_warnings"] = _route_warnings(c)
    return Target(
        site=site, site_url=args.nginx_url or stack.site_url, stub_status_url=args.stub_status_url or stub,
        access_log=args.access_log or stack.nginx_access_log,
        prometheus_url=args.prometheus_url or (stack.url("prometheus") if stack_addresses else _first(c.prometheus_url)),
        alertmanager_url=args.alertmanager_url or (stack.url("alertmanager") if stack_addresses
                                                   else _first(c.alertmanager_url)),
        controller_url=args.controller_url or (
            f"http://{stack.host}:{stack.ports['controller']}" if stack_addresses
            else f"http://{c.listen_address.rsplit(':', 1)[0]}:{c.listen_address.rsplit(':', 1)[1]}"),
        token_file=args.token_file or (stack.token_file if stack_addresses else c.token_file),
        registry_dir=args.registry_dir or route_registry_dir(registry, args.config_file or DEFAULT_CONFIG),
        min_floor=args.min_floor, extra=extra, stack_dir=stack.dir if running else None, stack_alive=alive,
        stack_dead=stack.dead() if running else [], stack_started=float(started) if started else None,
        other_alertmanagers=[] if args.alertmanager_url or stack_addresses else _rest(c.alertmanager_url),
        other_prometheus=[] if args.prometheus_url or stack_addresses else _rest(c.prometheus_url))


def route_registry_dir(value: Any, config_file: str | Path) -> Path | None:
    """A route's ``registry_dir`` as the controller reads it: a relative one against the
    configuration file's directory (the controller refuses it without one)."""
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else (Path(config_file).expanduser().absolute().parent / path)


def header(t: Target) -> str:
    """What the doctor checks: every address, and the stack directory its defaults come from."""
    out = (f"copy guard doctor, site {t.site}: nginx {t.site_url}, stub_status {t.stub_status_url}, log "
           f"{t.access_log}, Prometheus {', '.join([t.prometheus_url, *t.other_prometheus])}, Alertmanager "
           f"{', '.join([t.alertmanager_url, *t.other_alertmanagers])}, controller "
           f"{t.controller_url}")
    stack_dir = t.extra.get("stack_dir")
    if stack_dir is not None and t.extra.get("defaulted") == [] and not t.extra.get("stack_running"):
        out += "\nno stack used: every address was given by flag"
    elif stack_dir is not None:
        out += (f"\nstack directory {stack_dir}: " + ("a stack runs there" if t.extra.get("stack_running")
                                                      else "no stack runs there")
                + (" (stack.state_dir is relative: under the current directory; --state.dir or --config.file "
                   "names another)" if t.extra.get("stack_dir_from_cwd") else ""))
    return out


def cmd_doctor(args: argparse.Namespace) -> int:
    t = target_from(args)
    checks: list[Check] = []
    try:
        print(header(t), flush=True)
        checks = run_checks(t)
        print(render(checks))
        failed = [c for c in checks if c.status == FAIL]
        print(f"\n{len(failed)} broken link(s)" if failed else "\nevery link works", flush=True)
    except BrokenPipeError:  # `doctor | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1 if any(c.status == FAIL for c in checks) else 0


def add_doctor_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``doctor`` to the ``copy-guard`` subcommands (``promreflex copy-guard doctor``)."""
    from controllers.copy_guard.calibrate import MIN_FLOOR_RPS

    p = subparsers.add_parser("doctor", help="check every link of the copy guard's chain on this system",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config.file", dest="config_file", type=Path, default=None,
                   help="the configuration the stack (or your controller) runs with; default the embedded one")
    p.add_argument("--state.dir", dest="state_dir", type=Path, default=None, help="the local stack's state directory")
    p.add_argument("--site", default=None, help="the site label (default: accesslog.site, shop)")
    p.add_argument("--nginx.url", dest="nginx_url", default=None, help="the shop as visitors reach it")
    p.add_argument("--nginx.stub-status-url", dest="stub_status_url", default=None, help="nginx's stub_status URL")
    p.add_argument("--nginx.access-log", dest="access_log", type=Path, default=None, help="the access log the exporter follows")
    p.add_argument("--prometheus.url", dest="prometheus_url", default=None)
    p.add_argument("--alertmanager.url", dest="alertmanager_url", default=None)
    p.add_argument("--controller.url", dest="controller_url", default=None, help="e.g. http://127.0.0.1:9095")
    p.add_argument("--token-file", dest="token_file", type=Path, default=None, help="the controller's bearer token file")
    p.add_argument("--registry.dir", dest="registry_dir", type=Path, default=None, help="the copy-guard route's registry_dir")
    p.add_argument("--min-floor", type=float, default=MIN_FLOOR_RPS, help="the lowest sane demand floor (as calibrate)")
    p.add_argument("--textfile.dir", dest="textfile_dir", type=Path, default=None,
                   help="the directory your node_exporter's --collector.textfile.directory serves: the calibrate "
                        "command the doctor suggests publishes there (default: the stack's)")
    p.set_defaults(func=cmd_doctor)
    return p


def _rest(url: str | list[str] | None) -> list[str]:
    """The servers of a configured list after the first (checked after it)."""
    return [str(u) for u in url[1:]] if isinstance(url, list) else []


def _first(url: str | list[str] | None) -> str:
    """The server doctor checks of a configured URL or list of them (a Prometheus pair, an
    Alertmanager cluster: the first, as the controller reads it first)."""
    if isinstance(url, list):
        return url[0] if url else "None"
    return str(url)
