"""What an action is: typed parameters, a target, and what firing and resolved mean for it.

The engine guarantees, for every action:
- one run at a time per target (``target()``), and at most ``concurrency`` runs of the action
  at once across targets;
- ``fire`` and ``resolve`` alternate per (route, alert): a duplicate or a reconcile never runs
  the same transition twice once it completed;
- at least once per transition: a run the controller did not see complete (the process was
  killed during it, it timed out or raised) may have done all, part or none of its work. What
  is applied is then *unknown*, and whichever transition is desired next runs: the same one
  again while the alert still fires, ``resolve`` when it has ended meanwhile (also after a
  ``fire`` that failed before doing anything), ``fire`` when a new episode started during an
  interrupted ``resolve``. So ``fire`` and ``resolve`` must be idempotent (pausing a paused
  copy, writing the same report again) and ``resolve`` must succeed when there is nothing to
  undo;
- each run is cancelled after ``timeout`` (the route's ``timeout``, else the class attribute)
  and counted as failed: an action must not hold its target forever. Work pushed to a thread
  is not stopped by the cancellation; keep such calls short or give them their own timeout;
- a failed run is retried ``max_retries`` times (route) with exponential backoff and full
  jitter, then given up until something new arrives for the alert;
- the cooldown (from the route) delays a new ``fire`` on the same target, never a ``resolve``:
  undoing an action (resuming a paused copy) is always allowed at once. It starts after every
  ``fire`` run, failed or not, so a failing action does not hammer its target;
- ``shutdown`` runs when the controller stops, so an action can undo what must not outlive it;
- what a route applied is resolved with the binding (action, params) that applied it: after a
  reload or restart that removes the route, changes its ``action``, or changes params that
  change ``target()`` (the route's old binding runs ``resolve`` first, then the new one
  ``fire``). ``ctx.route`` is the route's configured name in both.

Alert label values reach an action as data (``ctx.labels``). An action must never execute them,
interpolate them into a shell command, or use them as a path.
"""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from controllers.models import Alert


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class ActionContext:
    """Everything an action may look at for one transition."""

    route: str
    alert: Alert
    params: BaseModel
    # Shared services: "prometheus" and "alertmanager" clients, the aiohttp "session", the
    # controller's metrics "registry" (an action's own metrics appear on the controller's /metrics),
    # and, with an Alertmanager, "alertmanager_presence" (Engine.presence: whether alerts are still
    # active, judged over every peer as the reconciliation judges an absence).
    services: dict[str, Any] = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        return self.alert.labels


class Deferred(Exception):  # noqa: N818 - an outcome, not an error
    """Raised by an action that cannot act NOW but will later (a tuning allowed only in a
    window): the engine neither counts a failure nor starts the route's cooldown; it records
    ``deferred`` and runs the transition again after ``seconds`` if it is still wanted (the
    alert still firing, checked with Alertmanager as for any fire)."""

    def __init__(self, message: str, seconds: float):
        super().__init__(message)
        self.seconds = max(1.0, float(seconds))


class Action(abc.ABC):
    """Base class; subclasses set ``name`` and ``Params`` and implement fire/resolve.

    ``fire`` and ``resolve`` run on the controller's event loop: they must never block it. A
    blocking call (``time.sleep``, ``subprocess.run``, a synchronous HTTP client, a file on a
    hung NFS mount) stops every webhook, route, reconciliation and ``/metrics`` for as long as
    it lasts, and the route's ``timeout`` cannot cancel it. Await instead
    (``asyncio.create_subprocess_exec``, aiohttp through ``ctx.services["session"]``), or run
    the call with ``asyncio.to_thread`` under its own bound (a thread is not cancelled: the
    timeout gives the target back, the thread runs on)."""

    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = NoParams
    concurrency: ClassVar[int] = 1
    resolved_means: ClassVar[str] = "nothing"
    timeout: ClassVar[float] = 300.0  # seconds one fire/resolve may take (a route may override it)
    #: The alert names the action is made for (empty: any): ``check-config`` warns about a route
    #: of it whose ``alertname`` matchers let none of them through (a typo'd regex, which
    #: Alertmanager-style matching anchors, made a copy-guard route that nothing reached).
    alert_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.log = logging.getLogger(f"promreflex.action.{self.name}")
        # The validated params of every route bound to this action, set by the engine before
        # ``start``: what an action needs to recover its own state after a crash.
        self.route_params: list[BaseModel] = []

    def run_timeout(self, params: BaseModel) -> float:
        """Seconds one run may take with these parameters, unless the route sets ``timeout``.
        An action whose runs last as long as its parameters say (a sweep) overrides this."""
        return self.timeout

    def target(self, ctx: ActionContext) -> str:
        """What two runs must not touch at once. Default: one target per route and alert."""
        return f"{ctx.route}/{ctx.alert.fingerprint}"

    @abc.abstractmethod
    async def fire(self, ctx: ActionContext) -> str:
        """Act on a firing alert; return a short description of what was done."""

    async def resolve(self, ctx: ActionContext) -> str:
        """Act on the alert's resolution (default: nothing to undo)."""
        return "nothing to undo"

    async def start(self, services: dict[str, Any]) -> None:
        """Called once when the controller starts (e.g. recover from a state file, using
        ``self.route_params``)."""

    async def shutdown(self) -> None:
        """Called once when the controller stops."""


_REGISTRY: dict[str, type[Action]] = {}
#: Action modules that could not be loaded (``controllers/<name>/action.py`` -> why, one line):
#: the other actions stay usable, and a route naming an action that is not there says why.
_BROKEN: dict[str, str] = {}
#: Names two modules' actions claim: neither is used (which one a route meant cannot be told,
#: and the first by folder order may be a newcomer's, not the shipped one).
_CLASHED: dict[str, str] = {}


def register(cls: type[Action]) -> type[Action]:
    first = _REGISTRY.get(cls.name)
    if first is not None and first is not cls and (first.__module__, first.__qualname__) != (cls.__module__, cls.__qualname__):
        why = (f"two actions are named {cls.name!r}: {first.__module__}.{first.__qualname__} and "
               f"{cls.__module__}.{cls.__qualname__}; neither is used until one is renamed")
        _CLASHED[cls.name] = why
        raise ValueError(why)
    _REGISTRY[cls.name] = cls  # (the same class again: a module imported anew after a failure)
    return cls


def registry() -> dict[str, type[Action]]:
    """Every action: the built-in ones and each capability's ``controllers/<name>/action.py``
    (imported here, registering itself with :func:`register`). A module that fails to import is
    left out, with what it registered before failing; a name two modules claim is left out for
    both; each is said in :func:`broken_actions`: one capability's mistake does not take every
    other capability's actions with it, nor a shipped action's routes to someone else's class."""
    import importlib
    import pkgutil
    from pathlib import Path

    import controllers

    importlib.import_module("controllers.actions.builtin")
    _BROKEN.clear()
    _CLASHED.clear()
    for root in map(Path, controllers.__path__):  # a test adds a folder of its own
        for pkg in pkgutil.iter_modules([str(root)]):
            if not (pkg.ispkg and (root / pkg.name / "action.py").is_file()):
                continue
            where, module = f"controllers/{pkg.name}/action.py", f"controllers.{pkg.name}.action"
            try:
                importlib.import_module(module)
            except Exception as e:  # noqa: BLE001 - any failure of a capability's module is one line
                _BROKEN[where] = f"{type(e).__name__}: {e}"
                for name in [n for n, c in _REGISTRY.items() if c.__module__ == module]:
                    del _REGISTRY[name]  # registered before the module failed: not usable
    return {name: cls for name, cls in _REGISTRY.items() if name not in _CLASHED}


def broken_actions() -> dict[str, str]:
    """What :func:`registry` left out, with why (one line each): modules by path, clashing
    action names as ``action '<name>'``."""
    registry()
    return {**_BROKEN, **{f"action {name!r}": why for name, why in _CLASHED.items()}}
