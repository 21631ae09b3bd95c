"""The local stack: the foundation (Prometheus, Alertmanager, node_exporter, nginx with a demo
site, the nginx exporter, the promreflex controller) and every capability's processes, all on
loopback, supervised from a state directory.

What runs, what is scraped and how alerts are routed come from the manifests
(:mod:`promreflex.capability`, :mod:`promreflex.foundation`): this module names no capability.
The same renderers build the compose stack (:mod:`promreflex.compose`).

Everything the stack needs is rendered into ``state_dir`` (configs, the webhook token, TSDB,
logs, ``pids.json``), so ``stack down`` stops exactly what ``stack up`` started, by PID, and
nothing outside that directory is touched. Intervals are the fast ones measured in
STACK-NOTES.md: controllers answer within about a second of a metric crossing a threshold.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from promreflex.capability import Capability, Context, Process, default_ports, format_duration, processes
from promreflex.config import Config, ScrapeJob, StackConfig, all_capabilities
from promreflex.errors import UserError
from promreflex.foundation import NGINX_LOG_FORMAT, paths
from promreflex.fsutil import atomic_write_json, atomic_write_text, read_json
from promreflex.proc import Child, Timeout, http_ok, pid_alive, port_in_use, terminate, wait_until

__all__ = ["NGINX_LOG_FORMAT", "Component", "Stack", "StackError", "alertmanager_config", "prometheus_config",
           "write_selftest_switch"]

#: The receiver every Alertmanager route ends at: the controller's webhook.
RECEIVER = "promreflex"
#: The foundation process ``stack.nginx.external`` replaces by an nginx that already runs.
EXTERNAL_NGINX_PROCESS = "nginx"
#: Components that re-read their configuration on SIGHUP (``Stack.reload``).
RELOADABLE = ("prometheus", "alertmanager", "nginx", "controller")


class StackError(UserError):
    """The stack cannot start or stop as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Component:
    """One process to start: a manifest's :class:`~promreflex.capability.Process` rendered for
    this stack, or an extra one a benchmark or test adds (a backend, an exporter)."""

    name: str
    port: int
    ready_url: str
    argv: list[str]


# ---------------------------------------------------------------------- shared renderers
def _interval(stack: StackConfig, interval: str | float) -> str:
    if interval == "fast":
        return format_duration(stack.fast_interval)
    if interval == "slow":
        return format_duration(stack.slow_interval)
    return format_duration(float(interval))


def scrape_configs(ctx: Context, capabilities: Sequence[Capability]) -> list[dict[str, Any]]:
    """One scrape job per manifest :class:`~promreflex.capability.Scrape`, in manifest order."""
    stack: StackConfig = ctx.config.stack  # type: ignore[attr-defined]
    jobs = []
    for cap in capabilities:
        for j in cap.scrape_jobs:
            interval = _interval(stack, j.interval)
            job: dict[str, Any] = {"job_name": j.job, "scrape_interval": interval, "scrape_timeout": interval}
            if j.metrics_path != "/metrics":
                job["metrics_path"] = j.metrics_path
            if j.params:
                job["params"] = {k: list(v) for k, v in j.params.items()}
            job["static_configs"] = [{"targets": [ctx.address(j.port)]}]
            jobs.append(job)
    return jobs


def prometheus_config(ctx: Context, capabilities: Sequence[Capability], rule_files: list[str],
                      extra_jobs: Sequence[ScrapeJob] = ()) -> dict[str, Any]:
    stack: StackConfig = ctx.config.stack  # type: ignore[attr-defined]
    fast, slow = format_duration(stack.fast_interval), format_duration(stack.slow_interval)
    return {
        "global": {"scrape_interval": slow, "scrape_timeout": slow, "evaluation_interval": fast,
                   "external_labels": {"stack": f"promreflex-{ctx.target}"}},
        "rule_files": rule_files,
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [ctx.address("alertmanager")]}]}]},
        "scrape_configs": [
            *scrape_configs(ctx, capabilities),
            *[{"job_name": j.job, "metrics_path": j.metrics_path,
               "scrape_interval": format_duration(j.interval or stack.fast_interval),
               "scrape_timeout": format_duration(j.interval or stack.fast_interval),
               "static_configs": [{"targets": j.targets}]} for j in extra_jobs],
        ],
    }


def alertmanager_config(ctx: Context, capabilities: Sequence[Capability]) -> dict[str, Any]:
    """Every alert goes to the controller; manifests add routes (same receiver) and inhibit rules.

    Timing is tuned for controllers, not people: ``group_wait: 0s`` sends a new alert at once,
    a short ``group_interval`` delivers resolved and re-firing alerts of a group within a tick,
    and ``group_by: ['...']`` turns grouping off (each alert is its own notification).
    """
    stack: StackConfig = ctx.config.stack  # type: ignore[attr-defined]
    return {
        "route": {
            "receiver": RECEIVER,
            "group_by": ["..."],
            "group_wait": "0s",
            "group_interval": format_duration(stack.group_interval),
            "repeat_interval": "1h",
            "routes": [{"receiver": RECEIVER, **route} for cap in capabilities for route in cap.alertmanager_routes],
        },
        "receivers": [{
            "name": RECEIVER,
            "webhook_configs": [{
                "url": ctx.url("controller", "/webhook"),
                "send_resolved": True,
                "max_alerts": 0,
                "http_config": {"authorization": {"type": "Bearer", "credentials_file": ctx.path("webhook_token")}},
            }],
        }],
        "inhibit_rules": [dict(rule) for cap in capabilities for rule in cap.inhibit_rules],
    }


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


class Stack:
    def __init__(self, cfg: Config, python: str = sys.executable, extra_components: list[Component] | None = None,
                 capabilities: Sequence[Capability] | None = None):
        """``extra_components`` (a benchmark's backend, an exporter a test adds) start first,
        before Prometheus, and are stopped last, like the manifests' ones. ``capabilities``
        replaces the installed ones (the foundation is always there)."""
        self.cfg = cfg
        # The file the configuration came from (the CLI sets it): recorded at `up`, so every
        # later command's hints (restart, down) name it, and `--state.dir` alone finds it again.
        self.config_file: Path | None = None
        self.capabilities = all_capabilities(capabilities)
        self.extra_components = list(extra_components or [])
        self.s = cfg.stack
        self.dir = self.s.state_dir.resolve()
        self.python = python
        self.host = self.s.host
        self.ports: dict[str, int] = {**default_ports(self.capabilities), **self.s.ports.model_dump()}
        # stack.nginx.external: the nginx that already runs is guarded, none is started.
        self.processes: list[Process] = [p for p in processes(self.capabilities, "local")
                                         if not (self.s.nginx.external and p.name == EXTERNAL_NGINX_PROCESS)]

    # ------------------------------------------------------------------ addresses
    def url(self, port: str) -> str:
        """``http://HOST:PORT`` of a named port (``prometheus``, ``nginx``, ``controller``, ...)."""
        return f"http://{self.host}:{self.ports[port]}"

    @property
    def site_url(self) -> str:
        """The shop as visitors reach it: the stack's nginx, or ``stack.nginx.url`` of an external one."""
        own = self.url("nginx") + "/"
        return (self.s.nginx.site_url or own) if self.s.nginx.external else own

    @property
    def urls(self) -> dict[str, str]:
        external = {EXTERNAL_NGINX_PROCESS: self.site_url} if self.s.nginx.external else {}
        return {
            **external,
            **{p.name: self.url(p.main_port) + p.show_path for p in self.processes},
            **{c.name: c.ready_url for c in self.extra_components},
        }

    @property
    def pids_file(self) -> Path:
        return self.dir / "pids.json"

    @property
    def token_file(self) -> Path:
        return self.dir / "webhook-token"

    @property
    def textfile_dir(self) -> Path:
        return self.dir / "textfile"

    @property
    def audit_log(self) -> Path:
        return self.dir / "controller" / "audit.jsonl"

    @property
    def nginx_access_log(self) -> Path:
        """The access log the stack's log readers follow: its own nginx's, or the external one's."""
        if self.s.nginx.external and self.s.nginx.access_log is not None:
            return self.s.nginx.access_log
        return self.dir / "nginx" / "access.log"

    def context(self) -> Context:
        return Context(target="local", host=self.host, ports=self.ports, hosts=dict.fromkeys(self.ports, self.host),
                       state_dir=self.dir, paths={**paths("local", self.dir), "nginx_access_log": str(self.nginx_access_log)},
                       config=self.cfg)

    # ------------------------------------------------------------------ rendering
    def rule_files(self) -> list[str]:
        """Every rules file in ``stack.rules_dir``, plus those manifests keep elsewhere."""
        rules_dir = self.s.rules_dir.resolve()
        extra = sorted({str(Path(r)) for cap in self.capabilities for r in cap.rules
                        if Path(r).is_absolute() and Path(r).parent != rules_dir})
        return [str(rules_dir / "*.yml"), *extra]

    def prometheus_config(self) -> dict[str, Any]:
        return prometheus_config(self.context(), self.capabilities, self.rule_files(), self.s.extra_scrape)

    def rules_problems(self) -> list[str]:
        """``promtool check rules`` over every rules file Prometheus would load, one problem per
        file it refuses (Prometheus refuses a whole reload, keeping its old rules, or its start,
        for one bad file). Nothing to say when promtool is not installed."""
        prometheus = next((p.binary for p in self.processes if p.name == "prometheus" and p.binary), None)
        beside = Path(prometheus).with_name("promtool") if prometheus else None  # the same release's
        promtool = str(beside) if beside and os.access(beside, os.X_OK) else shutil.which("promtool") or ""
        # (hidden files too: Prometheus' Go glob loads an editor's `.#x.rules.yml`, Python's skips it)
        files = sorted({f for pattern in self.rule_files() for f in glob.glob(pattern, include_hidden=True)})
        if not files or not promtool:
            return []
        try:
            r = subprocess.run([promtool, "check", "rules", *files], capture_output=True, text=True, timeout=300,
                               check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return [f"promtool check rules could not run: {e}"]
        if r.returncode == 0:
            return []
        said = [ln.strip() for ln in r.stderr.splitlines() if ln.strip() and ln.strip() != "FAILED:"]
        return [f"promtool check rules: {ln}" for ln in said] or [f"promtool check rules failed (exit {r.returncode})"]

    def alertmanager_config(self) -> dict[str, Any]:
        return alertmanager_config(self.context(), self.capabilities)

    def files(self) -> dict[str, str]:
        """Every file the processes need, relative to the state directory."""
        ctx = self.context()
        out = {"prometheus/prometheus.yml": dump_yaml(self.prometheus_config()),
               "alertmanager/alertmanager.yml": dump_yaml(self.alertmanager_config())}
        for p in self.processes:
            if p.files:
                out.update(p.files(ctx))
        return out

    def nginx_config(self) -> str:
        return self.files()["nginx/nginx.conf"]

    def controller_config(self) -> dict[str, Any]:
        return yaml.safe_load(self.files()["controller/promreflex.yml"])

    def render(self) -> None:
        for sub in ("prometheus/data", "alertmanager/data", "nginx/tmp", "controller", "logs", "textfile"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        if not self.token_file.exists():
            atomic_write_text(self.token_file, secrets.token_urlsafe(32) + "\n", mode=0o600)
        for rel, text in self.files().items():
            (self.dir / rel).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.dir / rel, text)
        switch = self.textfile_dir / "promreflex_selftest.prom"
        if not switch.exists():
            write_selftest_switch(self.textfile_dir, False)

    def argv(self, process: Process, ctx: Context) -> list[str]:
        program = [process.binary] if process.binary else [self.python, "-m", "promreflex"]
        return [*program, *process.args(ctx)]

    def components(self) -> list[Component]:
        ctx = self.context()
        return [
            *self.extra_components,
            *[Component(p.name, self.ports[p.main_port], self.url(p.ready_port or p.main_port) + p.ready_path,
                        self.argv(p, ctx)) for p in self.processes],
        ]

    # ------------------------------------------------------------------ lifecycle
    def running_urls(self) -> dict[str, str]:
        """Where each running component answers, as recorded when it started: ``stack status``
        run without the config file the stack was started with still shows the real ports."""
        recorded = self._recorded()
        return {name: recorded[name].get("url") or self.urls.get(name, "") for name in self.running()}

    def running(self) -> dict[str, int]:
        """Components of a stack started from this state dir that are still alive."""
        alive = {}
        for name, info in self._recorded().items():
            pid = info["pid"]
            if pid_alive(pid) and _cmdline_starts_with(pid, info["argv0"]):
                alive[name] = pid
        return alive

    def record(self) -> dict[str, Any]:
        """What ``up`` recorded in ``pids.json``: ``components``, ``started``, ``config_file``."""
        return read_record(self.dir)

    def recorded_config_file(self) -> Path | None:
        """The configuration file the running stack was started with, if it was recorded."""
        value = self.record().get("config_file")
        return Path(value) if value else None

    def flags(self) -> str:
        """The command-line flags that find this stack again (for the hints we print)."""
        cfg = self.config_file or self.recorded_config_file()
        return f" --config.file {cfg} --state.dir {self.dir}" if cfg else f" --state.dir {self.dir}"

    def dead(self) -> list[str]:
        """Recorded components of a stack started from this state dir that are no longer alive
        (and still components of this configuration)."""
        alive = self.running()
        known = {c.name for c in self.components()}
        return [n for n in self._recorded() if n not in alive and n in known]

    def preflight(self) -> None:
        alive = self.running()
        if alive:
            listing = ", ".join(f"{n} pid {pid}" for n, pid in alive.items())
            dead = self.dead()
            restart = (f"\nNot running: {', '.join(dead)} (logs in {self.dir / 'logs'}); start them again with: "
                       f"promreflex stack restart {' '.join(dead)}{self.flags()}") if dead else ""
            raise StackError(
                f"a stack is already running from {self.dir} ({listing}).\n"
                f"Prometheus: {self.url('prometheus')}  -- stop it with: promreflex stack down{self.flags()}"
                + restart
            )
        missing = [p.binary for p in self.processes if p.binary and not os.access(p.binary, os.X_OK)]
        if missing:
            raise StackError(f"missing binaries: {', '.join(missing)}; run `make deps` (scripts/install-system.sh)")
        bad_rules = self.rules_problems()
        if bad_rules:
            raise StackError("Prometheus would refuse these rules, nothing started:\n" + "\n".join(bad_rules))
        names = [name for p in self.processes for name in p.ports]
        busy = [(name, self.ports[name]) for name in names if port_in_use(self.host, self.ports[name])]
        if busy:
            listing = ", ".join(f"{port} ({name})" for name, port in busy)
            raise StackError(
                f"port(s) already in use on {self.host}: {listing}. Another program (or a stack from another "
                "state dir) holds them; set stack.ports.<name> in the config file to use others."
            )

    def up(self, timeout: float = 60.0, progress=print) -> dict[str, int]:
        """Start every component, in order, each ready before the next; returns PIDs."""
        self.preflight()
        # Nothing of an earlier stack runs here: its record (a crash, a reboot) is not this one's.
        self.pids_file.unlink(missing_ok=True)
        self.render()
        n = self.s.nginx
        if n.external and n.access_log is not None and not n.access_log.exists():
            progress(f"  warning: stack.nginx.access_log {n.access_log} does not exist (yet): its readers wait "
                     "for it; your nginx must write it (the capabilities' doctor commands check the chain)")
        self.preflight_warnings(progress)
        try:
            for comp in self.components():
                self.start_component(comp.name, timeout=timeout, progress=progress)
        except BaseException:
            self.down(quiet=True)
            raise
        return {name: info["pid"] for name, info in self._recorded().items()}

    def preflight_warnings(self, progress=print) -> None:
        """Each capability's checks of its inputs (``Capability.preflight``), as warnings."""
        ctx = self.context()
        for cap in self.capabilities:
            for check in cap.preflight:
                for warning in check(ctx):
                    progress(f"  warning ({cap.name}): {warning}")

    def _recorded(self) -> dict[str, dict[str, Any]]:
        return self.record().get("components", {})

    def start_component(self, name: str, timeout: float = 60.0, progress=print) -> int:
        """Start one component (again) and record its PID; waits until it is ready."""
        comp = next(c for c in self.components() if c.name == name)
        child = Child(comp.name, comp.argv, self.dir / "logs" / f"{comp.name}.log").start()
        recorded = self._recorded()
        recorded[comp.name] = {"pid": child.pid, "argv0": comp.argv[0], "argv": comp.argv, "port": comp.port,
                               "log": str(child.log_path), "url": self.urls.get(comp.name, "")}
        previous = self.record()
        started = previous.get("started", time.time())
        config_file = str(self.config_file.resolve()) if self.config_file else previous.get("config_file")
        # Insertion order is start order: `down` stops in reverse.
        atomic_write_json(self.pids_file, {"started": started, "config_file": config_file, "components": recorded},
                          sort_keys=False)
        t0 = time.monotonic()
        try:
            wait_until(lambda: _ready_or_dead(comp, child), timeout=timeout, what=f"{comp.name} ready")
        except Timeout as e:
            raise StackError(f"{comp.name} did not become ready: {e}\n--- {child.log_path}:\n{child.tail()}") from e
        if not child.alive():
            code = child.popen.returncode if child.popen else None
            raise StackError(f"{comp.name} exited at start (code {code}).{self._start_hint(comp.name)}\n"
                             f"--- {child.log_path}:\n{child.tail()}")
        progress(f"  {comp.name:<19} ready in {time.monotonic() - t0:4.1f}s  pid {child.pid:<7} {self.urls[comp.name]}")
        return child.pid

    def _start_hint(self, name: str) -> str:
        """Which configuration key a component that failed at start depends on (the guarded
        nginx's stub_status is the usual culprit: the nginx exporter exits when it does not answer)."""
        if name == "nginx_exporter" and self.s.nginx.external:
            return (f" It reads the stub_status of the nginx you run at {self.s.nginx.stub_status_url} "
                    "(stack.nginx.stub_status_url): `curl -s` it, it must answer 200 with the active connections.")
        return ""

    def stop_component(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Stop one recorded component (SIGKILL to simulate a crash); it stays recorded, so
        ``start_component`` can bring it back and ``down`` still knows about it."""
        info = self._recorded()[name]
        if pid_alive(info["pid"]) and _cmdline_starts_with(info["pid"], info["argv0"]):
            terminate(info["pid"], grace=15, sig=sig)

    def down(self, quiet: bool = False, progress=print) -> list[str]:
        """Stop what ``up`` started (reverse order), by PID. pids.json is removed only when
        nothing it names is left running, so a failed stop can be retried."""
        recorded = self.record()
        components = recorded.get("components", {})
        stopped, left = [], {}
        for name, info in reversed(list(components.items())):
            pid = info["pid"]
            if not (pid_alive(pid) and _cmdline_starts_with(pid, info["argv0"])):
                continue
            if terminate(pid, grace=15):
                stopped.append(name)
                if not quiet:
                    progress(f"  stopped {name} (pid {pid})")
            else:
                left[name] = info
                progress(f"  could not stop {name} (pid {pid})")
        if left:
            atomic_write_json(self.pids_file, {**recorded, "components": left}, sort_keys=False)
        else:
            self.pids_file.unlink(missing_ok=True)
        return stopped

    def reload(self, progress=print) -> list[str]:
        """Apply a changed configuration file: render every file again and send SIGHUP to the
        components that re-read theirs (Prometheus: rules and scrape jobs; Alertmanager: routes;
        the controller: its routes, keeping its state; the stack's nginx), and restart the others
        whose command line the change touched (the exporters: the guarded nginx's access log or
        stub_status URL; the access-log exporter resumes where it stopped). A dead component is
        left to ``stack restart``. Ports and the set of processes are not reloaded (``stack
        down`` + ``stack up``). Returns the components signalled or restarted; StackError when no
        stack runs from this state dir."""
        alive = self.running()
        if not alive:
            raise StackError(f"no stack running from {self.dir}: start it with `promreflex stack up`")
        recorded = self._recorded()
        moved = sorted(n for n, info in recorded.items() if n in self.ports and info.get("port") != self.ports[n])
        if moved:
            raise StackError(f"ports changed for {', '.join(moved)}: `stack down` then `stack up` to apply them")
        ctx = self.context()
        problems = [p for cap in self.capabilities for check in cap.reload_checks for p in check(ctx)]
        problems += self.rules_problems()
        if problems:  # (nothing rendered, nothing signalled: the running stack keeps its files)
            raise StackError("the configuration is refused, nothing reloaded:\n" + "\n".join(problems))
        self.render()
        self.preflight_warnings(progress)
        audit_size = self.audit_log.stat().st_size if self.audit_log.exists() else 0
        signalled = []
        for name in RELOADABLE:
            pid = alive.get(name)
            if pid is None:
                continue
            os.kill(pid, signal.SIGHUP)
            signalled.append(name)
            progress(f"  reloaded {name} (SIGHUP to pid {pid})")
        if "controller" in signalled:
            progress(self._reload_outcome(audit_size))
        for comp in self.components():
            info = recorded.get(comp.name)
            if comp.name in RELOADABLE or comp.name not in alive or not info:
                continue
            if "argv" not in info:  # started by a version that did not record it
                progress(f"  {comp.name}: started before this version recorded command lines; a change to it "
                         f"applies after `promreflex stack restart {comp.name}{self.flags()}`")
                continue
            if info["argv"][1:] != comp.argv[1:]:  # (argv[0]: the interpreter a later command runs under)
                progress(f"  {comp.name}: its command line changed, restarting it")
                self.stop_component(comp.name)
                self.start_component(comp.name, progress=progress)
                signalled.append(comp.name)
        return signalled

    def restart(self, names: Sequence[str] = (), progress=print) -> list[str]:
        """Stop (if alive) and start again the named components of the running stack, with
        the current configuration; none named: the dead ones. Returns those started."""
        recorded = self._recorded()
        if not recorded:
            raise StackError(f"no stack started from {self.dir}: `promreflex stack up`")
        known = [c.name for c in self.components()]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise StackError(f"no component {', '.join(unknown)}; the stack's: {', '.join(known)}")
        todo = list(names) or self.dead()
        bad_rules = self.rules_problems() if "prometheus" in todo else []
        if bad_rules:  # (a running Prometheus keeps its rules; one started with these would not start)
            raise StackError("Prometheus would refuse these rules, nothing restarted:\n" + "\n".join(bad_rules))
        for name in todo:
            if name in recorded:
                self.stop_component(name)
            self.start_component(name, progress=progress)
        return todo

    def _reload_outcome(self, offset: int, timeout: float = 10.0) -> str:
        """What the controller made of the reload, from its audit log (its ``reload`` record):
        the routes added, changed and removed, or why it kept the old ones. A route list that
        replaces the defaults silently drops the routes it does not name; this says so."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self.audit_log.open("rb") as f:
                    f.seek(offset)
                    lines = f.read().decode(errors="replace").splitlines()
            except OSError:
                lines = []
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(rec, dict) or rec.get("event") != "reload":
                    continue
                if rec.get("result") != "ok":
                    return f"  controller kept its routes: {rec.get('error', 'the new file was refused')}"
                parts = [f"{what} {', '.join(rec.get(what) or []) or '-'}" for what in ("added", "changed", "removed")]
                return f"  controller routes: {'; '.join(parts)} (now {len(rec.get('routes') or [])})"
            time.sleep(0.2)
        return f"  the controller did not report the reload within {timeout:g}s: see {self.audit_log}"

    def check_children(self) -> list[str]:
        """Names of recorded components that died."""
        return [n for n, i in self._recorded().items() if not pid_alive(i["pid"])]

    def wipe(self) -> None:
        """Remove the state directory (tests use a temporary one)."""
        shutil.rmtree(self.dir, ignore_errors=True)


def read_record(state_dir: Path) -> dict[str, Any]:
    """The ``pids.json`` of the stack in ``state_dir`` ({} when none)."""
    return read_json(Path(state_dir) / "pids.json", default={}) or {}


def _ready_or_dead(comp: Component, child: Child) -> bool:
    return (not child.alive()) or http_ok(comp.ready_url)


def _cmdline_starts_with(pid: int, argv0: str) -> bool:
    """Guards against PID reuse: only signal a process that still runs the recorded program.
    nginx rewrites its title (``nginx: master process /usr/sbin/nginx -c ...``), so the program
    may stand anywhere in the command line."""
    try:
        cmd = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
    first = cmd.split(" ", 1)[0]
    return argv0 in cmd or Path(first.rstrip(":")).name == Path(argv0).name


def write_selftest_switch(textfile_dir: Path, on: bool) -> Path:
    """The self-test gauge node_exporter's textfile collector serves: flips PromreflexSelftest."""
    path = textfile_dir / "promreflex_selftest.prom"
    atomic_write_text(path, (
        "# HELP promreflex_selftest_switch 1 while the self-test alert should fire (promreflex selftest fire).\n"
        "# TYPE promreflex_selftest_switch gauge\n"
        f"promreflex_selftest_switch {1 if on else 0}\n"
    ))
    return path


def describe(stack: Stack) -> str:
    return json.dumps(stack.urls, indent=2)
