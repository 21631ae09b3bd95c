"""A throwaway capability, defined here and nowhere else: proof that adding a capability needs
no change in ``promreflex/``. Tests pass it explicitly (``capabilities=[demo]``) to the config
loader, the CLI, the local stack and the compose generator.

It brings everything a capability can: a subcommand, a config section, a process (Python's
http.server serving a static ``/metrics`` file it renders), a scrape job, a controller route, an
Alertmanager route and inhibit rule, and a rules file kept outside ``rules/``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import Field

from promreflex.capability import Capability, ComposeService, Context, Process, Scrape
from promreflex.config import DEFAULT_CONFIG, Strict, load_config

PORT = 19777


class DemoSection(Strict):
    greeting: str = Field(default="hello", pattern=r"^[a-z]+$")
    repeat: int = Field(default=1, ge=1)


def _args(ctx: Context) -> list[str]:
    python = ["python"] if ctx.target == "compose" else []
    return [*python, "-m", "http.server", str(ctx.ports["demo"]), "--bind", ctx.host,
            "--directory", f"{ctx.state_dir}/demo-www"]


def _files(ctx: Context) -> dict[str, str]:
    greeting = ctx.section("demo").greeting
    return {"demo-www/metrics": ("# HELP demo_greeting_info The throwaway capability's greeting.\n"
                                 "# TYPE demo_greeting_info gauge\n"
                                 f'demo_greeting_info{{greeting="{greeting}"}} 1\n')}


def _hello(args: argparse.Namespace) -> int:
    cfg = load_config(args.config_file or DEFAULT_CONFIG, capabilities=args.capabilities)
    print(" ".join([cfg.demo.greeting] * cfg.demo.repeat))  # type: ignore[attr-defined]
    return 0


def _register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo-hello", help="print the demo section's greeting")
    p.add_argument("--config.file", dest="config_file", type=Path, default=None, help="YAML configuration")
    p.set_defaults(func=_hello)


def make(rules_file: Path) -> Capability:
    rules_file.write_text(
        "groups:\n  - name: demo.alerts\n    rules:\n"
        "      - alert: DemoGreetingMissing\n        expr: absent(demo_greeting_info)\n        for: 1m\n"
        "        labels: {severity: warning}\n"
        "        annotations: {summary: no greeting, description: the demo exporter is silent}\n"
    )
    return Capability(
        name="demo",
        summary="a throwaway capability",
        cli=(_register,),
        config_section="demo",
        config_model=DemoSection,
        processes=(Process("demo_server", _args, {"demo": PORT}, binary=sys.executable, files=_files,
                           compose=ComposeService(image="PYTHON_IMAGE", comment="the throwaway capability")),),
        scrape_jobs=(Scrape("demo", "demo", "fast"),),
        routes=({"name": "demo-log", "matchers": ['alertname="DemoAlert"'], "action": "log"},),
        alertmanager_routes=({"matchers": ['alertname="DemoAlert"'], "repeat_interval": "5m"},),
        inhibit_rules=({"source_matchers": ['alertname="DemoDown"'], "target_matchers": ['alertname="DemoAlert"'],
                        "equal": ["instance"]},),
        rules=(rules_file,),
    )
