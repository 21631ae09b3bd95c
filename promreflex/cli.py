"""The ``promreflex`` command. Flags follow the Prometheus style (``--config.file``).

The core's own subcommands (``stack``, ``selftest``, ``compose``, ``config``) are here; every
other subcommand comes from a capability manifest's ``cli`` (:mod:`promreflex.capability`),
discovered through entry points: this module names none of them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from promreflex.logs import setup as setup_logging
from promreflex import __version__
from promreflex.capability import Capability, CapabilityError, Context, default_ports
from promreflex.config import DEFAULT_CONFIG, REPO_ROOT, Config, ConfigError, all_capabilities, load_config
from promreflex.errors import UserError
from promreflex.proc import pid_alive

__all__ = ["DEFAULT_CONFIG", "build_parser", "main"]


def _load(args: argparse.Namespace) -> Config:
    overrides = {}
    if getattr(args, "state_dir", None):
        overrides["stack.state_dir"] = args.state_dir
    return load_config(args.config_file or DEFAULT_CONFIG, overrides, getattr(args, "capabilities", None))


def _stack(args: argparse.Namespace) -> Any:
    """The Stack of a `stack` subcommand. With `--state.dir` and no `--config.file`, the file the
    stack there was started with (recorded at `up`): a restart with the embedded defaults would
    start a component on the default ports and files, beside the running stack's."""
    from promreflex.stack import Stack, read_record

    cfg = _load(args)
    if args.config_file is None:
        state_dir = cfg.stack.state_dir.expanduser().resolve()
        recorded = read_record(state_dir).get("config_file")
        if recorded and Path(recorded).exists():
            args.config_file = Path(recorded)
            print(f"(the stack in {state_dir} was started with --config.file {recorded}: using it)", file=sys.stderr)
            cfg = _load(args)
        elif recorded:
            print(f"warning: the stack in {state_dir} was started with --config.file {recorded}, which is gone: "
                  "using the defaults", file=sys.stderr)
    stack = Stack(cfg, capabilities=args.capabilities)
    stack.config_file = Path(args.config_file) if args.config_file else None
    return stack


def uv_command() -> str:
    """How to call uv here: ``uv`` when it is on PATH, else the repository's ``scripts/uv``
    (which installed it on first use), as a path from the current directory."""
    if shutil.which("uv"):
        return "uv"
    path = REPO_ROOT / "scripts" / "uv"
    rel = os.path.relpath(path)
    return shlex.quote(str(path) if rel.startswith("..") else rel)


def cmd_stack_up(args: argparse.Namespace) -> int:
    stack = _stack(args)
    print(f"promreflex {__version__}: starting the local stack (state in {stack.dir})")
    stack.up()
    u = stack.urls
    flags = "".join(f" --{flag} {value}" for flag, value in
                    (("config.file", args.config_file), ("state.dir", args.state_dir)) if value)
    cmd = f"{uv_command()} run promreflex"
    # The hint only where a route acts on the self-test alert (a routes list without it: none).
    selftest = (f"  fire the self-test    {cmd} selftest fire{flags}     (then: selftest clear)\n"
                if any('"PromreflexSelftest"' in m for r in stack.cfg.controller.routes for m in r.matchers) else "")
    print(f"""
The stack is up. Try:
  Prometheus alerts     {u['prometheus']}/classic/alerts
  Alertmanager API      curl -s {u['alertmanager']}/api/v2/alerts | python3 -m json.tool
  {"your shop (external)" if stack.s.nginx.external else "the demo shop":<20}  curl -s {u['nginx']}
  controller metrics    curl -s {u['controller']} | grep promreflex_controller_actions
{selftest}  watch the controller  tail -f {stack.audit_log}
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


def cmd_stack_reload(args: argparse.Namespace) -> int:
    stack = _stack(args)
    print(f"reloaded {', '.join(stack.reload())} from {stack.dir}")
    dead = stack.dead()
    if dead:
        print(f"not running, so not reloaded: {', '.join(dead)} (a route change does not reach a dead controller); "
              f"start them with `promreflex stack restart{stack.flags()}`", file=sys.stderr)
        return 1
    return 0


def cmd_stack_down(args: argparse.Namespace) -> int:
    stack = _stack(args)
    stopped = stack.down()
    print(f"stopped {len(stopped)} component(s) from {stack.dir}" if stopped else f"no stack running from {stack.dir}")
    return 0


def cmd_stack_status(args: argparse.Namespace) -> int:
    stack = _stack(args)
    alive = stack.running()
    if not alive:
        print(f"no stack running from {stack.dir}")
        return 1
    urls = stack.running_urls()
    if stack.s.nginx.external:
        print(f"  {'nginx (external)':<19} {'not ours':<11} {'':4}  {stack.site_url}  (guarded, not started by the stack)")
    for name, pid in alive.items():
        print(f"  {name:<19} pid {pid:<7} {'up' if pid_alive(pid) else 'down'}  {urls.get(name, '')}")
    dead = stack.dead()
    for name in dead:
        print(f"  {name:<19} {'NOT RUNNING':<11}       log {stack.dir / 'logs' / (name + '.log')}")
    if dead:
        print(f"{len(dead)} component(s) not running: start them again with `promreflex stack restart{stack.flags()}`",
              file=sys.stderr)
        return 1
    return 0


def cmd_stack_restart(args: argparse.Namespace) -> int:
    stack = _stack(args)
    started = stack.restart(args.names)
    print(f"restarted {', '.join(started)} from {stack.dir}" if started else f"every component of {stack.dir} runs")
    return 0


def cmd_selftest(args: argparse.Namespace) -> int:
    from promreflex.stack import Stack, write_selftest_switch

    stack = Stack(_load(args), capabilities=args.capabilities)
    path = write_selftest_switch(stack.textfile_dir, args.state == "fire")
    print(f"promreflex_selftest_switch = {1 if args.state == 'fire' else 0} ({path})")
    if not stack.running():
        # Not an error: with your own node_exporter reading this directory, no local stack runs.
        print(f"note: no local stack runs from {stack.dir}; only a node_exporter whose "
              f"--collector.textfile.directory is {stack.textfile_dir} will see it "
              "(started the stack with --state.dir or --config.file? pass the same here)", file=sys.stderr)
    return 0


def cmd_compose_build(args: argparse.Namespace) -> int:
    from promreflex.compose import build

    return build(args.dir, check=args.check, capabilities=args.capabilities)


def _find(names: Sequence[str], capabilities: Sequence[Capability]) -> list[Capability]:
    by_name = {cap.name: cap for cap in capabilities}
    # Routes and actions are spelled with dashes (copy-guard), capabilities with underscores
    # (copy_guard): accept either.
    wanted = [n.replace("-", "_") for n in names]
    unknown = [n for n, w in zip(names, wanted, strict=True) if w not in by_name]
    if unknown:
        raise UserError(f"no capability {', '.join(map(repr, unknown))}; installed: {', '.join(by_name)}")
    return [by_name[w] for w in wanted]


def _on_host(job: Mapping[str, Any], host: str) -> dict[str, Any]:
    """A user scrape job with its targets' host set to ``host`` (their port kept), as the other
    jobs of the snippets (a review: --host moved every job but this one)."""
    out = json.loads(json.dumps(job))
    for sc in out.get("static_configs", []):
        sc["targets"] = [f"{host}:{t.rsplit(':', 1)[1]}" for t in sc.get("targets", [])]
    return out


def snippets(chosen: Sequence[Capability], host: str, token_file: str, rules_dir: Path,
             capabilities: Sequence[Capability]) -> str:
    """What a user with their own Prometheus and Alertmanager pastes to add ``chosen``: rule
    files, scrape jobs, the Alertmanager receiver with routes and inhibit rules, and the
    controller's configuration; generated from the manifests, so it never drifts from the stack."""
    from promreflex.stack import RECEIVER, alertmanager_config, scrape_configs

    ports = default_ports(capabilities)
    cfg = load_config(None, capabilities=[c for c in capabilities if c.name != "foundation"])
    ctx = Context(target="local", host=host, ports=ports, hosts=dict.fromkeys(ports, host), state_dir=Path("."),
                  paths={"webhook_token": token_file}, config=cfg)
    am = alertmanager_config(ctx, chosen)
    # One Alertmanager sub-route per controller route, fast and ungrouped like the local stack's;
    # `continue: true` keeps the alert flowing to your own receivers as well.
    am_routes = [{"receiver": RECEIVER, "matchers": list(r["matchers"]), "group_by": ["..."], "group_wait": "0s",
                  "group_interval": "1s", "continue": True} for cap in chosen for r in cap.routes]
    am_routes += [{**r, "continue": True} for r in am["route"]["routes"]]
    dump = lambda d: yaml.safe_dump(d, sort_keys=False).rstrip()  # noqa: E731
    sections: list[tuple[str, dict[str, Any]]] = [
        ("prometheus.yml: rule_files (`promtool check config` checks them)",
         {"rule_files": [str(r if Path(r).is_absolute() else rules_dir / r) for cap in chosen for r in cap.rules]}),
        ("prometheus.yml: scrape_configs", {"scrape_configs": scrape_configs(ctx, chosen)
                                            + [_on_host(j, host) for cap in chosen for j in cap.user_scrape_jobs]}),
        ("alertmanager.yml: the controller's receiver (bearer token from a file)", {"receivers": am["receivers"]}),
        ("alertmanager.yml: under your top-level `route:`, the alerts the controller answers",
         {"routes": am_routes}),
        ("alertmanager.yml: inhibit_rules", {"inhibit_rules": am["inhibit_rules"]}),
        ("the controller's file: `promreflex controller --config.file promreflex.yml` (check it first with "
         "`promreflex check-config --config.file promreflex.yml`)",
         {"controller": {"listen_address": f"{host}:{ports['controller']}", "token_file": token_file,
                         "routes": [dict(r) for cap in chosen for r in cap.routes]}}),
    ]
    parts = [f"# {cap.name}: {cap.summary}" for cap in chosen]
    number = 0
    for title, body in sections:
        if any(body.values()):
            number += 1
            parts.append(f"\n# {number}. {title}\n{dump(body)}")
    return "\n".join(parts) + "\n"


def cmd_config_snippets(args: argparse.Namespace) -> int:
    caps = all_capabilities(args.capabilities)
    print(snippets(_find(args.capability, caps), args.host, args.token_file, args.rules_dir, caps), end="")
    return 0


def cmd_config_list(args: argparse.Namespace) -> int:
    for cap in all_capabilities(args.capabilities):
        section = f"  [{cap.config_section}:]" if cap.config_section else ""
        print(f"{cap.name:<12} {cap.summary}{section}")
    return 0


def build_parser(capabilities: Sequence[Capability] | None = None) -> argparse.ArgumentParser:
    """The whole CLI: the core's subcommands, then each capability's (``capabilities``
    replaces the installed ones; the foundation is always there)."""
    caps = all_capabilities(capabilities)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config.file", dest="config_file", type=Path, default=None,
                        help=f"YAML configuration (default: the embedded {DEFAULT_CONFIG.name})")
    common.add_argument("--state.dir", dest="state_dir", type=Path, default=None,
                        help="where the local stack keeps configs, data, logs and PIDs (default .promreflex/stack)")
    common.add_argument("--log.level", dest="log_level", default="info", choices=["debug", "info", "warning", "error"],
                        help="log verbosity (default info)")

    parser = argparse.ArgumentParser(prog="promreflex", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"promreflex {__version__}")
    parser.set_defaults(capabilities=capabilities)
    sub = parser.add_subparsers(dest="command", required=True)

    stack = sub.add_parser("stack", help="run the local stack (Prometheus, Alertmanager, exporters, nginx, controller)")
    stack_sub = stack.add_subparsers(dest="stack_command", required=True)
    up = stack_sub.add_parser("up", parents=[common], help="start the stack on loopback")
    up.add_argument("--detach", action="store_true", help="start and return instead of running until Ctrl-C")
    up.set_defaults(func=cmd_stack_up)
    stack_sub.add_parser("down", parents=[common], help="stop what `stack up` started").set_defaults(func=cmd_stack_down)
    stack_sub.add_parser("reload", parents=[common], help="apply a changed configuration (routes, rules, scrape jobs) "
                                                         "without a restart").set_defaults(func=cmd_stack_reload)
    stack_sub.add_parser("status", parents=[common], help="show the components (exit 1 if any is not running)"
                         ).set_defaults(func=cmd_stack_status)
    rs = stack_sub.add_parser("restart", parents=[common], help="start components again (default: those not running)")
    rs.add_argument("names", nargs="*", metavar="COMPONENT", help="a component, as `stack status` names it")
    rs.set_defaults(func=cmd_stack_restart)

    st = sub.add_parser("selftest", parents=[common], help="flip the self-test alert of the local stack")
    st.add_argument("state", choices=["fire", "clear"], help="fire: PromreflexSelftest fires; clear: it resolves")
    st.set_defaults(func=cmd_selftest)

    compose = sub.add_parser("compose", help="the compose stack's files, generated from the manifests")
    compose_sub = compose.add_subparsers(dest="compose_command", required=True)
    cb = compose_sub.add_parser("build", help="write compose/*.yml from the manifests (--check: fail on drift)")
    cb.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed file differs")
    cb.add_argument("--dir", type=Path, default=None, help="compose directory (default: the repository's compose/)")
    cb.set_defaults(func=cmd_compose_build)

    from promreflex import kube

    kube.register(sub)

    config = sub.add_parser("config", help="what the installed capabilities bring")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    config_sub.add_parser("list", help="the installed capabilities").set_defaults(func=cmd_config_list)
    sn = config_sub.add_parser("snippets", help="rules, scrape jobs, receiver and routes to paste into your own "
                                                "Prometheus, Alertmanager and controller configuration")
    sn.add_argument("capability", nargs="+", help="names from `promreflex config list` (foundation: the self-test)")
    sn.add_argument("--host", default="127.0.0.1", help="where the exporters and the controller run (default 127.0.0.1)")
    sn.add_argument("--token-file", default="/etc/promreflex/webhook-token",
                    help="the bearer token file Alertmanager and the controller share")
    sn.add_argument("--rules-dir", type=Path, default=Path(__file__).resolve().parent.parent / "rules",
                    help="where the rules files are (default: this installation's rules/)")
    sn.set_defaults(func=cmd_config_snippets)

    for cap in caps:
        for register in cap.cli:
            try:
                register(sub)
            except Exception as e:  # noqa: BLE001 - a clash or a CLI module that fails to import: one line
                raise CapabilityError(f"capability {cap.name!r}: its command line ({register.__qualname__}) "
                                      f"cannot be registered: {type(e).__name__}: {e}") from e
    return parser


def main(argv: list[str] | None = None, capabilities: Sequence[Capability] | None = None) -> int:
    try:
        parser = build_parser(capabilities)
        args = parser.parse_args(argv)
        if getattr(args, "dir", 0) is None and getattr(args, "command", "") == "compose":
            from promreflex.compose import COMPOSE_DIR

            args.dir = COMPOSE_DIR
        setup_logging(getattr(args, "log_level", "info"))
        return args.func(args) or 0
    except ConfigError as e:
        print(f"promreflex: configuration error in {e}", file=sys.stderr)
        return 2
    except UserError as e:
        # Start-up failures a user can fix (a busy port, a missing token file, a broken
        # capability): one line, no traceback.
        print(f"promreflex: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `promreflex stack status | head -1`: the reader left, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
