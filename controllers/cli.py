"""``promreflex controller`` (the Alertmanager webhook controller) and ``promreflex
check-config`` (validate a configuration file, bind its routes to actions, check the token file
and exit). Registered by the ``controller`` manifest (``controllers/manifest.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from promreflex.config import DEFAULT_CONFIG, Config, ConfigError, load_config
from promreflex.errors import UserError


def _load(args: argparse.Namespace) -> Config:
    overrides = {"controller.listen_address": args.listen_address} if getattr(args, "listen_address", None) else {}
    return load_config(args.config_file or DEFAULT_CONFIG, overrides, getattr(args, "capabilities", None))


def cmd_check_config(args: argparse.Namespace) -> int:
    from controllers import server
    from controllers.engine import bind_routes

    from controllers.actions.base import broken_actions

    cfg = _load(args)
    bound = bind_routes(cfg.controller)
    server.preflight(cfg.controller)
    for where, why in sorted(broken_actions().items()):  # no route uses it, or bind_routes said so
        print(f"warning: {where} not loaded, its actions are unavailable: {why}", file=sys.stderr)
    for warning in unreachable_routes(bound):
        print(f"warning: {warning}", file=sys.stderr)
    print(f"{args.config_file or DEFAULT_CONFIG}: OK ({len(cfg.controller.routes)} routes)")
    return 0


def unreachable_routes(bound: list[Any]) -> list[str]:
    """Routes whose action is made for some alerts (``Action.alert_names``) but whose
    ``alertname`` matchers let none of them through. Matchers on other labels are not judged
    (any value may come)."""
    out = []
    for b in bound:
        names = getattr(b.action, "alert_names", ())
        on_name = [m for m in b.matchers if m.name == "alertname"]
        if not names or not on_name:
            continue
        through = [n for n in names if all(m.matches({"alertname": n}) for m in on_name)]
        if len(through) < len(names):
            missed = [n for n in names if n not in through]
            out.append(f"route {b.route.name!r} runs {b.action.name} but its matchers "
                       f"({', '.join(map(str, on_name))}) let {'none' if not through else 'not'} "
                       f"{'of its alerts' if not through else ', '.join(missed)} through "
                       f"({'expected ' + ', '.join(names) if not through else 'only ' + ', '.join(through)}): "
                       "a regex must match the whole name (=~ is anchored, as in Alertmanager)")
    return out


def reload_check(ctx: Any) -> list[str]:
    """What check-config checks of the controller's section, for ``stack reload`` (before it
    signals anything: a route the controller would refuse must not leave Prometheus and
    Alertmanager reloaded without it)."""
    from controllers.engine import bind_routes

    cfg = ctx.config.controller
    try:  # the routes and their actions' own checks; not the webhook token file, which the stack
        # replaces with its own (server.preflight would check the user's, unused here)
        for bound in bind_routes(cfg):
            check = getattr(bound.action, "preflight", None)
            if callable(check):
                check(bound.params)
    except (ConfigError, UserError) as e:
        return [str(e)]
    return []


def cmd_controller(args: argparse.Namespace) -> int:
    from controllers.server import serve

    # SIGHUP (or POST /-/reload) reads the same file again and swaps the routes in place.
    asyncio.run(serve(_load(args).controller, load=lambda: _load(args).controller))
    return 0


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config.file", dest="config_file", type=Path, default=None,
                   help=f"YAML configuration; the controller reads its `controller:` section (routes, token_file, "
                        f"state_file, audit_log, ...). Default: the embedded {DEFAULT_CONFIG.name}")
    p.add_argument("--log.level", dest="log_level", default="info", choices=["debug", "info", "warning", "error"],
                   help="log verbosity (default info)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``controller`` and ``check-config`` to a ``promreflex`` CLI."""
    ctl = subparsers.add_parser(
        "controller", help="run the Alertmanager webhook controller",
        description="Serve POST /webhook for Alertmanager (webhook_configs url http://HOST:PORT/webhook), run the "
                    "routes' actions, reconcile with Alertmanager's active alerts; /metrics and /-/ready beside it.")
    _add_common(ctl)
    ctl.add_argument("--web.listen-address", dest="listen_address", default=None, metavar="HOST:PORT",
                     help="where the controller serves /webhook, /metrics and /-/ready "
                          "(overrides controller.listen_address; default 127.0.0.1:9095)")
    ctl.set_defaults(func=cmd_controller)

    chk = subparsers.add_parser("check-config", help="validate a configuration file and exit",
                                description="Load the configuration, bind each route to its action (parameters "
                                            "checked), check the controller's token file; exit 0 when usable.")
    _add_common(chk)
    chk.set_defaults(func=cmd_check_config)
