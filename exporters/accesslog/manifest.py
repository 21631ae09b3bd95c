"""The access-log exporter's manifest: the smallest complete capability, and the example to copy.

A capability is a folder plus one ``Capability`` object like this one, announced in
``pyproject.toml``::

    [project.entry-points."promreflex.capabilities"]
    accesslog = "exporters.accesslog.manifest:CAPABILITY"

Then ``uv sync`` (the editable install re-reads the entry points) and every part of promreflex
sees it: ``promreflex --help`` lists its subcommand, ``promreflex stack up`` runs its process
and scrapes it, ``python -m promreflex compose build`` gives it a compose service and a scrape
job, and its configuration section is validated with the rest of the file. Nothing in
``promreflex/`` has to change.
"""

from __future__ import annotations

from pydantic import Field

from promreflex.capability import Capability, ComposeService, Context, Process, Scrape, lazy
from promreflex.config import Strict


# 1. Configuration: a top-level YAML section of its own (here ``accesslog:``), validated with
#    the rest of the file; every problem is reported by key (``accesslog.site: ...``).
#    Defaults must make a valid section: a file without ``accesslog:`` is fine.
class AccessLogSection(Strict):
    site: str = Field(default="shop", pattern=r"^[a-zA-Z0-9_.-]+$",
                      description="the `site` label of the stack's nginx access log (rules and dashboards group by it)")


# 2. The process the local stack and compose run. ``args`` builds the command line from a
#    Context: ``ctx.listen(port)`` is where to bind, ``ctx.path(...)`` a file shared with another
#    process (nginx writes this log), ``ctx.section(...)`` this capability's configuration,
#    ``ctx.state_dir`` the stack's state directory. No binary: it runs ``promreflex`` itself.
def _args(ctx: Context) -> list[str]:
    site = ctx.section("accesslog").site
    return ["exporter-accesslog", f"--log={site}={ctx.path('nginx_access_log')}:nginx_timed",
            f"--web.listen-address={ctx.listen('accesslog_exporter')}", f"--state.dir={ctx.state_dir}/accesslog"]


CAPABILITY = Capability(
    name="accesslog",
    summary="request rates by status class and a latency histogram from nginx/Apache access logs",
    # 3. Subcommands: functions given the CLI's subparsers (``promreflex exporter-accesslog``);
    #    ``lazy`` imports the module only when the CLI is built.
    cli=(lazy("exporters.accesslog.cli:register"),),
    config_section="accesslog",
    config_model=AccessLogSection,
    processes=(
        # Named ports with defaults (``stack.ports.accesslog_exporter`` overrides it; ready when
        # GET /metrics answers). Order 60: after nginx, before the controller.
        Process("accesslog_exporter", _args, {"accesslog_exporter": 9181}, ready_path="/metrics",
                compose=ComposeService(
                    comment="request rates by status class and the latency histogram that stub_status cannot give",
                    extra={"volumes": ["nginx-logs:/var/log/nginx/shop:ro",
                                       "accesslog-state:/var/lib/promreflex/accesslog"],
                           "depends_on": ["nginx"]})),
    ),
    # 4. What Prometheus scrapes: the job name rules and dashboards use, the named port, and an
    #    interval class (fast = stack.fast_interval, 200 ms by default).
    scrape_jobs=(Scrape("accesslog", "accesslog_exporter", "fast"),),
    # 5. Checks before the stack starts anything (warnings): a guarded nginx's log in a format
    #    this exporter cannot read.
    preflight=(lazy("exporters.accesslog.preflight:warnings"),),
    # 6. Its rules file (under rules/, with its promtool test in rules/tests/): the exporter's own
    #    health. The copy guard's and the nginx tuner's rules read its series. It acts on nothing,
    #    so no routes; a capability that acts adds ``routes`` (the controller's), and
    #    ``alertmanager_routes`` / ``inhibit_rules`` the same way (see controllers/rca/manifest.py).
    rules=("accesslog.rules.yml",),
)
