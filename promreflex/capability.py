"""What a capability brings, declared once: the one way a capability plugs into promreflex.

A capability (an exporter, a controller action with its rules, ...) is a folder with a
``manifest.py`` holding one :class:`Capability`, announced in ``pyproject.toml``::

    [project.entry-points."promreflex.capabilities"]
    accesslog = "exporters.accesslog.manifest:CAPABILITY"

From the manifests alone the core builds everything that used to list capabilities by hand:
the CLI's subcommands, the configuration model (one YAML section per capability), the local
stack's processes, Prometheus' scrape jobs, Alertmanager's routes and inhibit rules, the
controller's default routes, and the compose files. The core never imports a capability and
never names one: it only iterates over :func:`discover` (or a list a caller passes, as tests do
with a throwaway capability). ``exporters/accesslog/manifest.py`` is the commented example.

The foundation (Prometheus, Alertmanager, node_exporter, nginx, the controller) is described
with the same classes in :mod:`promreflex.foundation`.

This module imports nothing from the rest of promreflex but :mod:`promreflex.errors`, so every
other core module may import it without a cycle.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from promreflex.errors import UserError

#: The entry-point group capabilities are announced in (pyproject.toml).
ENTRY_POINT_GROUP = "promreflex.capabilities"

Interval = Literal["fast", "slow"] | float
"""A scrape interval: ``fast`` / ``slow`` follow ``stack.fast_interval`` / ``stack.slow_interval``
(200 ms / 5 s by default); a number is a fixed interval in seconds."""


class CapabilityError(UserError):
    """A capability that cannot be loaded or that clashes with another; one line, naming it."""


@dataclass(frozen=True)
class Context:
    """Where the processes run, handed to every argv and file builder.

    ``target`` is ``local`` (``promreflex stack up``: loopback, a state directory) or
    ``compose`` (one container per process, reached by service name). Builders should use the
    helpers (``listen``, ``url``, ``path``) rather than branch on ``target``.
    """

    target: Literal["local", "compose"]
    host: str  # what processes listen on: 127.0.0.1 locally, 0.0.0.0 in a container
    ports: Mapping[str, int]  # every named port of every process
    hosts: Mapping[str, str]  # port name -> host that reaches it (127.0.0.1, or a compose service)
    state_dir: Path  # the stack's state directory (local) or /var/lib/promreflex (compose)
    paths: Mapping[str, str]  # files shared between processes, by name (nginx_access_log, ...)
    config: BaseModel  # the whole loaded configuration; see section()

    def listen(self, port: str) -> str:
        """``HOST:PORT`` a process binds for its named ``port``."""
        return f"{self.host}:{self.ports[port]}"

    def address(self, port: str) -> str:
        """``HOST:PORT`` another process uses to reach the named ``port``."""
        return f"{self.hosts[port]}:{self.ports[port]}"

    def url(self, port: str, path: str = "") -> str:
        return f"http://{self.address(port)}{path}"

    def path(self, name: str) -> str:
        return self.paths[name]

    def section(self, name: str) -> Any:
        """A capability's own configuration section (its pydantic model, validated)."""
        return getattr(self.config, name)


Argv = Callable[[Context], Sequence[str]]
Files = Callable[[Context], Mapping[str, str]]


@dataclass(frozen=True)
class ComposeService:
    """How a process runs in the compose stack (``python -m promreflex compose build``).

    ``image`` names the ``.env`` variable holding the pinned tag; ``PROMREFLEX_IMAGE`` (the
    default) is built from this repository. ``extra`` is merged into the service as is
    (volumes, secrets, published ports, healthcheck, depends_on, ...); named volumes it uses are
    declared automatically. ``ports`` overrides a named port's number inside the container.
    """

    image: str = "PROMREFLEX_IMAGE"
    service: str | None = None  # default: the process name with '_' -> '-'
    extra: Mapping[str, Any] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)
    comment: str = ""


@dataclass(frozen=True)
class Process:
    """A long-running process of the stack.

    ``binary`` is the program (checked before anything starts); ``None`` runs ``promreflex``
    itself (``python -m promreflex`` locally, the image's entry point in compose). ``args``
    builds the rest of the command line from a :class:`Context`. ``ports`` are named ports with
    their defaults (``stack.ports.<name>`` overrides them; names are unique over all manifests);
    the first is the process' main port. Readiness: ``GET http://HOST:<ready_port><ready_path>``
    answers 2xx. Processes start by ascending ``order`` (foundation: 10-50, the controller 90;
    capabilities default to 60) and stop in reverse. ``files`` are configuration files the
    process needs, relative to the state directory (locally) or to ``compose/`` (generated); in
    compose each is mounted read-only at the same place under the state directory
    (``/var/lib/promreflex/<file>``) unless one of the service's own ``./`` volumes brings it in.
    """

    name: str
    args: Argv
    ports: Mapping[str, int]
    binary: str | None = None
    ready_path: str = "/metrics"
    ready_port: str | None = None  # default: the main port
    show_path: str = "/metrics"  # what `stack status` prints, on the main port
    order: int = 60
    files: Files | None = None
    compose: ComposeService | None = field(default_factory=ComposeService)  # None: local stack only
    local: bool = True  # False: compose only (Grafana)

    @property
    def main_port(self) -> str:
        return next(iter(self.ports))


@dataclass(frozen=True)
class Scrape:
    """A Prometheus scrape job of the named ``port`` (whichever process declares it)."""

    job: str
    port: str
    interval: Interval = "fast"
    params: Mapping[str, list[str]] = field(default_factory=dict)
    metrics_path: str = "/metrics"
    comment: str = ""


@dataclass(frozen=True, eq=False)
class Capability:
    """Everything one capability brings. Only ``name`` and ``summary`` are required.

    - ``cli``: functions ``register(subparsers)`` adding subcommands to ``promreflex``;
      each subcommand sets ``func`` (args -> exit status) with ``set_defaults``.
    - ``config_section`` + ``config_model``: the capability's own top-level YAML section,
      validated with the rest of the file (every problem reported by key). The model's
      defaults must make a valid section.
    - ``processes`` / ``scrape_jobs``: what ``promreflex stack up`` and compose run and scrape.
    - ``routes``: the controller's default routes (``controller.routes`` entries) used when the
      embedded default configuration is loaded.
    - ``alertmanager_routes`` / ``inhibit_rules``: Alertmanager configuration fragments
      (the receiver is filled in: every route goes to the controller).
    - ``rules`` / ``dashboards``: file names under ``rules/`` and ``dashboards/`` (or absolute
      paths for rules kept elsewhere); documentation and the ``config snippets`` command use
      them, a test checks each file in those folders belongs to exactly one manifest.
    - ``preflight``: checks of its inputs that ``stack up`` runs first, printed as warnings.
    - ``reload_checks``: checks that ``stack reload`` runs before it renders or signals
      anything; any problem refuses the reload.
    - ``host_actions``: which of its actions act on the host they run on (see the field).
    """

    name: str
    summary: str
    cli: Sequence[Callable[[argparse._SubParsersAction], Any]] = ()
    config_section: str | None = None
    config_model: type[BaseModel] | None = None
    processes: Sequence[Process] = ()
    scrape_jobs: Sequence[Scrape] = ()
    routes: Sequence[Mapping[str, Any]] = ()
    alertmanager_routes: Sequence[Mapping[str, Any]] = ()
    inhibit_rules: Sequence[Mapping[str, Any]] = ()
    rules: Sequence[str | Path] = ()
    dashboards: Sequence[str] = ()
    #: Checks of the capability's inputs before ``stack up`` starts anything: each takes the
    #: Context and returns warnings (a guarded nginx's log in a format its exporter cannot read).
    preflight: Sequence[Callable[[Context], list[str]]] = ()
    #: Checks before ``stack reload`` renders or signals anything: each takes the Context and
    #: returns problems (a route the controller would refuse); any problem refuses the reload,
    #: so no component is left reloaded with a configuration another one refused.
    reload_checks: Sequence[Callable[[Context], list[str]]] = ()
    #: Actions (by name) that touch the host they run on (pause a copy, retune nginx): on more
    #: than one machine they run in each host's agent, for that host's alerts only; every other
    #: action runs once, in the central controller (``promreflex kube build``, the fleet).
    host_actions: Sequence[str] = ()
    #: Scrape jobs of processes the USER runs, in front of their own app (not the stack's):
    #: ``config snippets`` prints them (a job name and a default target, to adjust); ``stack up``
    #: adds them only through ``stack.extra_scrape`` (a review: the admission proxy's job was in
    #: no snippet, so its rules evaluated over nothing).
    user_scrape_jobs: Sequence[Mapping[str, Any]] = ()


def lazy(target: str) -> Callable[..., Any]:
    """``lazy("exporters.accesslog.cli:register")``: a function that imports ``target`` when
    first called, so loading a manifest stays cheap (its CLI module may import a lot)."""
    module, _, attr = target.partition(":")

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)

    call.__qualname__ = call.__name__ = f"lazy({target})"
    return call


_discovered: tuple[Capability, ...] | None = None


def discover() -> tuple[Capability, ...]:
    """The capabilities installed through the ``promreflex.capabilities`` entry points, by name.

    A manifest that fails to import raises :class:`CapabilityError` naming the entry point.
    """
    global _discovered
    if _discovered is None:
        found = []
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            try:
                cap = ep.load()
            except Exception as e:  # noqa: BLE001 - any import failure is reported as one line
                raise CapabilityError(
                    f"capability {ep.name!r} ({ep.value}) cannot be loaded: {type(e).__name__}: {e}"
                ) from e
            if not isinstance(cap, Capability):
                raise CapabilityError(f"capability {ep.name!r} ({ep.value}) is not a promreflex Capability")
            found.append(cap)
        _discovered = tuple(found)
    return _discovered


def format_duration(seconds: float) -> str:
    """The Prometheus spelling of a duration: 0.2 -> ``200ms``, 60 -> ``1m``."""
    ms = round(seconds * 1000)
    if ms % 60000 == 0 and ms:
        return f"{ms // 60000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


def check_unique(capabilities: Sequence[Capability]) -> None:
    """Names, config sections, processes, ports and scrape jobs must not clash between manifests."""
    seen: dict[str, dict[str, str]] = {}
    for cap in capabilities:
        keys = {
            "capability": [cap.name],
            "config section": [cap.config_section] if cap.config_section else [],
            "process": [p.name for p in cap.processes],
            "port": [port for p in cap.processes for port in p.ports],
            "scrape job": [j.job for j in cap.scrape_jobs],
        }
        for kind, names in keys.items():
            owners = seen.setdefault(kind, {})
            for name in names:
                if name in owners:
                    raise CapabilityError(f"{kind} {name!r} is declared by both {owners[name]!r} and {cap.name!r}")
                owners[name] = cap.name
        if (cap.config_section is None) != (cap.config_model is None):
            raise CapabilityError(f"capability {cap.name!r}: config_section and config_model go together")
        if cap.config_model is not None:
            try:
                cap.config_model()
            except ValidationError as e:  # the section a user leaves out is the model's defaults
                fields = ", ".join(".".join(str(x) for x in err["loc"]) for err in e.errors())
                raise CapabilityError(
                    f"capability {cap.name!r}: {cap.config_model.__name__} has no valid default for {fields} "
                    "(a config model's defaults must make a valid section)") from None
    declared = seen.get("port", {})
    for cap in capabilities:
        for job in cap.scrape_jobs:
            if job.port not in declared:
                raise CapabilityError(
                    f"capability {cap.name!r}: scrape job {job.job!r} names port {job.port!r}, which no process "
                    f"declares (known: {', '.join(sorted(declared))})")


def processes(capabilities: Sequence[Capability], target: Literal["local", "compose"] | None = None) -> list[Process]:
    """Every process in start order; with ``target``, only those the local stack or compose runs."""
    procs = [p for cap in capabilities for p in cap.processes]
    if target == "local":
        procs = [p for p in procs if p.local]
    elif target == "compose":
        procs = [p for p in procs if p.compose is not None]
    return sorted(procs, key=lambda p: p.order)


def default_ports(capabilities: Sequence[Capability]) -> dict[str, int]:
    """Every named port with its default, in start order."""
    return {name: port for p in processes(capabilities) for name, port in p.ports.items()}
