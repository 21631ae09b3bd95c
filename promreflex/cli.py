"""The ``promreflex`` command. Flags follow the Prometheus style (``--config.file``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from pathlib import Path

from promreflex import __version__
from promreflex.config import Config, ConfigError, load_config
from promreflex.proc import pid_alive

DEFAULT_CONFIG = Path(__file__).with_name("defaults.yml")

# Capabilities add their subcommands here: each module has ``register(subparsers)``.
SUBCOMMAND_MODULES: list[str] = [
    "exporters.accesslog.cli",
    "exporters.mesh.cli",
    "controllers.copy_guard.cli",
    "controllers.copy_guard.calibrate",
    "controllers.nginx_tuner.cli",
    "controllers.rca.cli",
]


def _load(args: argparse.Namespace) -> Config:
    overrides = {}
    if getattr(args, "state_dir", None):
        overrides["stack.state_dir"] = args.state_dir
    if getattr(args, "listen_address", None):
        overrides["controller.listen_address"] = args.listen_address
    return load_config(args.config_file or DEFAULT_CONFIG, overrides)


def cmd_check_config(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from controllers.engine import bind_routes

    bind_routes(cfg.controller)
    print(f"{args.config_file or DEFAULT_CONFIG}: OK ({len(cfg.controller.routes)} routes)")
    return 0


def cmd_controller(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from controllers.server import serve

    asyncio.run(serve(cfg.controller))
    return 0


def cmd_stack_up(args: argparse.Namespace) -> int:
    from promreflex.stack import Stack

    cfg = _load(args)
    stack = Stack(cfg)
    print(f"promreflex {__version__}: starting the local stack (state in {stack.dir})")
    stack.up()
    u = stack.urls
    flags = "".join(f" --{flag} {value}" for flag, value in
                    (("config.file", args.config_file), ("state.dir", args.state_dir)) if value)
    cmd = "uv run promreflex"
    print(f"""
The stack is up. Try:
  Prometheus alerts     {u['prometheus']}/classic/alerts
  Alertmanager API      curl -s {u['alertmanager']}/api/v2/alerts | python3 -m json.tool
  the demo shop         curl -s {u['nginx']}
  controller metrics    curl -s {u['controller']} | grep promreflex_controller_actions
  fire the self-test    {cmd} selftest fire{flags}     (then: selftest clear)
  watch the controller  tail -f {stack.audit_log}
  replay a webhook      see docs/runbook.md#replay-a-webhook
""")
    if args.detach:
        print(f"Detached. Stop it with: {cmd} stack down{flags}")
        return 0
    print("Running until Ctrl-C.")
    stop = {"flag": False}
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.update(flag=True))
    while not stop["flag"]:
        dead = stack.check_children()
        if dead:
            print(f"component(s) exited: {', '.join(dead)}; logs in {stack.dir / 'logs'}. Stopping.", file=sys.stderr)
            stack.down()
            return 1
        time.sleep(0.5)
    print("\nStopping the stack.")
    stack.down()
    return 0


def cmd_stack_down(args: argparse.Namespace) -> int:
    from promreflex.stack import Stack

    stack = Stack(_load(args))
    stopped = stack.down()
    print(f"stopped {len(stopped)} component(s) from {stack.dir}" if stopped else f"no stack running from {stack.dir}")
    return 0


def cmd_stack_status(args: argparse.Namespace) -> int:
    from promreflex.stack import Stack

    stack = Stack(_load(args))
    alive = stack.running()
    if not alive:
        print(f"no stack running from {stack.dir}")
        return 1
    for name, pid in alive.items():
        print(f"  {name:<19} pid {pid:<7} {'up' if pid_alive(pid) else 'down'}  {stack.urls[name]}")
    return 0


def cmd_selftest(args: argparse.Namespace) -> int:
    from promreflex.stack import Stack, write_selftest_switch

    stack = Stack(_load(args))
    path = write_selftest_switch(stack.textfile_dir, args.state == "fire")
    print(f"promreflex_selftest_switch = {1 if args.state == 'fire' else 0} ({path})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config.file", dest="config_file", type=Path, default=None,
                        help=f"YAML configuration (default: the embedded {DEFAULT_CONFIG.name})")
    common.add_argument("--state.dir", dest="state_dir", type=Path, default=None,
                        help="where the local stack keeps configs, data, logs and PIDs (default .promreflex/stack)")
    common.add_argument("--log.level", dest="log_level", default="info", choices=["debug", "info", "warning", "error"])

    parser = argparse.ArgumentParser(prog="promreflex", description=__doc__)
    parser.add_argument("--version", action="version", version=f"promreflex {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    stack = sub.add_parser("stack", help="run the local stack (Prometheus, Alertmanager, exporters, nginx, controller)")
    stack_sub = stack.add_subparsers(dest="stack_command", required=True)
    up = stack_sub.add_parser("up", parents=[common], help="start the stack on loopback")
    up.add_argument("--detach", action="store_true", help="start and return instead of running until Ctrl-C")
    up.set_defaults(func=cmd_stack_up)
    stack_sub.add_parser("down", parents=[common], help="stop what `stack up` started").set_defaults(func=cmd_stack_down)
    stack_sub.add_parser("status", parents=[common], help="show the running components").set_defaults(func=cmd_stack_status)

    ctl = sub.add_parser("controller", parents=[common], help="run the Alertmanager webhook controller")
    ctl.add_argument("--web.listen-address", dest="listen_address", default=None)
    ctl.set_defaults(func=cmd_controller)

    chk = sub.add_parser("check-config", parents=[common], help="validate a configuration file and exit")
    chk.set_defaults(func=cmd_check_config)

    st = sub.add_parser("selftest", parents=[common], help="flip the self-test alert of the local stack")
    st.add_argument("state", choices=["fire", "clear"])
    st.set_defaults(func=cmd_selftest)

    import importlib

    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, getattr(args, "log_level", "info").upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args) or 0
    except ConfigError as e:
        print(f"promreflex: configuration error in {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - a clear one-line error, not a traceback, for expected failures
        from promreflex.stack import StackError

        if isinstance(e, StackError):
            print(f"promreflex: {e}", file=sys.stderr)
            return 1
        raise
