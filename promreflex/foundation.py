"""The foundation: Prometheus, Alertmanager, node_exporter, nginx with its exporter, the
controller and (compose only) Grafana, described with the same manifest classes as any
capability (:mod:`promreflex.capability`). It is not a capability: it lives in the core, is
always present, and comes first.

Each argv builder takes a :class:`~promreflex.capability.Context`; the few paths that differ
between the local stack and a container come from :func:`paths`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from promreflex.capability import Capability, ComposeService, Context, Process, Scrape, format_duration

#: The access-log format the stack's nginx writes: nginx "combined" plus request and upstream
#: times (capabilities that read the log, such as a latency exporter, rely on it).
NGINX_LOG_FORMAT = (
    '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
    '"$http_referer" "$http_user_agent" rt=$request_time urt="$upstream_response_time"'
)



def nginx_temp_paths(base: str, indent: str = "    ") -> str:
    """nginx's five temporary-file paths under ``base``, one directive a line (each ``indent``-ed).

    An nginx run as an unprivileged user or from a private prefix must not write to the
    compiled-in /var/lib/nginx; every nginx config promreflex renders (the stack, the fleet's
    shops, the benches) points them into its own directory with this.
    """
    kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    return "\n".join(f"{indent}{k}_temp_path {base}/{'body' if k == 'client_body' else k};" for k in kinds)


#: What containers see (compose/docker-compose.yml mounts these).
COMPOSE_STATE_DIR = Path("/var/lib/promreflex")
WEBHOOK_SECRET = "promreflex_webhook_token"

_HEALTH = {"interval": "5s", "timeout": "3s", "retries": 12}


def paths(target: str, state_dir: Path) -> dict[str, str]:
    """Files shared between processes, by name, for the local stack or compose."""
    if target == "local":
        d = state_dir
        return {
            "prometheus_config": f"{d}/prometheus/prometheus.yml", "prometheus_data": f"{d}/prometheus/data",
            "alertmanager_config": f"{d}/alertmanager/alertmanager.yml", "alertmanager_data": f"{d}/alertmanager/data",
            "controller_config": f"{d}/controller/promreflex.yml", "webhook_token": f"{d}/webhook-token",
            "controller_token": f"{d}/webhook-token",
            "audit_log": f"{d}/controller/audit.jsonl", "controller_state": f"{d}/controller/state.db",
            "textfile_dir": f"{d}/textfile", "nginx_access_log": f"{d}/nginx/access.log",
        }
    return {
        "prometheus_config": "/etc/prometheus/prometheus.yml", "prometheus_data": "/prometheus",
        "alertmanager_config": "/etc/alertmanager/alertmanager.yml", "alertmanager_data": "/alertmanager",
        "controller_config": "/etc/promreflex/promreflex.yml", "webhook_token": f"/run/secrets/{WEBHOOK_SECRET}",
        # Compose mounts a secret file with its host mode, readable by Alertmanager (nobody) and
        # the controller (uid 10001) alike; the controller refuses a token others can read, so
        # its entrypoint copies the secret to a file of its own, mode 0600 (see CONTROLLER_ENTRYPOINT).
        "controller_token": "/tmp/promreflex-webhook-token",
        # Relative to the controller container's working directory, /var/lib/promreflex (a volume).
        "audit_log": ".promreflex/audit.jsonl", "controller_state": ".promreflex/controller-state.db",
        "textfile_dir": "/var/lib/node_exporter/textfile_collector", "nginx_access_log": "/var/log/nginx/shop/access.log",
    }


def _healthcheck(url: str) -> dict[str, Any]:
    return {"test": ["CMD", "wget", "-q", "-O", "/dev/null", url], **_HEALTH}


def _prometheus(ctx: Context) -> list[str]:
    s = ctx.config.stack  # type: ignore[attr-defined]
    return [f"--config.file={ctx.path('prometheus_config')}", f"--storage.tsdb.path={ctx.path('prometheus_data')}",
            f"--web.listen-address={ctx.listen('prometheus')}",
            # Without it an alert that fires before Alertmanager is known arrives a minute late.
            f"--rules.alert.resend-delay={format_duration(s.resend_delay)}",
            "--storage.tsdb.retention.time=2d", "--web.enable-lifecycle"]


def _alertmanager(ctx: Context) -> list[str]:
    # A single instance: no gossip port (it would bind 0.0.0.0:9094).
    return [f"--config.file={ctx.path('alertmanager_config')}", f"--storage.path={ctx.path('alertmanager_data')}",
            f"--web.listen-address={ctx.listen('alertmanager')}", "--cluster.listen-address="]


def _node_exporter(ctx: Context) -> list[str]:
    return [f"--web.listen-address={ctx.listen('node_exporter')}", "--no-collector.systemd",
            f"--collector.textfile.directory={ctx.path('textfile_dir')}"]


def _nginx(ctx: Context) -> list[str]:
    if ctx.target == "compose":
        return []  # the image's own command, with compose/nginx/nginx.conf mounted
    d = ctx.state_dir / "nginx"
    return ["-c", f"{d}/nginx.conf", "-p", f"{d}", "-g", "daemon off;"]


def nginx_config(ctx: Context) -> str:
    """The local stack's nginx: the demo site (or a proxy to ``stack.upstream``) and stub_status."""
    s = ctx.config.stack  # type: ignore[attr-defined]
    d = ctx.state_dir / "nginx"
    upstream = ""
    if s.upstream:
        # Connections to the backend are reused (an admission proxy behind this nginx: README),
        # and a request may wait there longer than nginx's 60 s default (the proxy's session
        # queue plus a page's timeout): 5 min, above the proxy's own bounds.
        upstream = f"upstream promreflex_upstream {{ server {s.upstream}; keepalive 32; }}"
        location = ("location / { proxy_pass http://promreflex_upstream; proxy_http_version 1.1; "
                    'proxy_set_header Connection ""; proxy_set_header Host $host; proxy_read_timeout 5m; }')
    else:
        location = "location / { index index.html; }"
    return f"""# Rendered by promreflex stack; edits are overwritten at the next `stack up`.
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    types {{ text/html html; text/css css; application/javascript js; image/svg+xml svg; }}
    default_type application/octet-stream;
    log_format promreflex '{NGINX_LOG_FORMAT}';
    access_log {ctx.path('nginx_access_log')} promreflex;
{nginx_temp_paths(f"{d}/tmp")}
    keepalive_timeout 65;
    {upstream}
    server {{
        listen {ctx.listen('nginx')};
        root {s.site_dir.resolve()};
        {location}
    }}
    server {{
        listen {ctx.listen('nginx_stub_status')};
        access_log off;
        location = /stub_status {{ stub_status; }}
    }}
}}
"""


def _nginx_files(ctx: Context) -> dict[str, str]:
    return {"nginx/nginx.conf": nginx_config(ctx)} if ctx.target == "local" else {}


def _stub_status_url(ctx: Context) -> str:
    """The stack's own nginx's stub_status, or the one of the nginx it guards (stack.nginx)."""
    external = ctx.config.stack.nginx  # type: ignore[attr-defined]
    if ctx.target == "local" and external.external:
        return str(external.stub_status_url)
    return ctx.url("nginx_stub_status", "/stub_status")


def _nginx_exporter(ctx: Context) -> list[str]:
    # The exporter exits at start if stub_status is unreachable: give nginx time to come up.
    return [f"-nginx.scrape-uri={_stub_status_url(ctx)}",
            f"-web.listen-address={ctx.listen('nginx_exporter')}", "-nginx.retries=10", "-nginx.retry-interval=1s"]


def controller_config(ctx: Context) -> dict[str, Any]:
    """The controller's configuration file: the user's ``controller`` section (only what was
    set), wired to this stack's Alertmanager, Prometheus, token and state paths."""
    c = ctx.config.controller.model_dump(mode="json", exclude_unset=True)  # type: ignore[attr-defined]
    c.update({
        "listen_address": ctx.listen("controller"),
        "alertmanager_url": ctx.url("alertmanager"),
        "prometheus_url": ctx.url("prometheus"),
        "token_file": ctx.path("controller_token"),
        "audit_log": ctx.path("audit_log"),
        "state_file": ctx.path("controller_state"),
    })
    return {"controller": c}


def _controller(ctx: Context) -> list[str]:
    argv = ["controller", f"--config.file={ctx.path('controller_config')}"]
    if ctx.target == "local":
        return argv
    # In compose the entrypoint is `sh -c`: copy the secret (mounted with its host mode, readable
    # by Alertmanager's user too) to a 0600 file of the controller's own user, which the
    # controller accepts, then exec the controller.
    return [f"install -m 0600 {ctx.path('webhook_token')} {ctx.path('controller_token')}"
            f" && exec promreflex {' '.join(argv)}"]


def _controller_files(ctx: Context) -> dict[str, str]:
    name = "controller/promreflex.yml" if ctx.target == "local" else "promreflex/promreflex.yml"
    header = ("# Generated by `python -m promreflex compose build` from the manifests; do not edit.\n"
              "# The controller listens beyond loopback (the compose network), so it requires the bearer\n"
              "# token Alertmanager sends (compose secret promreflex_webhook_token, see ../README.md).\n"
              if ctx.target == "compose" else "")
    return {name: header + yaml.safe_dump(controller_config(ctx), sort_keys=False)}


_PROMREFLEX_HEALTH = {
    "test": ["CMD", "python", "-c",
             "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9095/-/ready', timeout=2)"],
    **_HEALTH,
}

FOUNDATION = Capability(
    name="foundation",
    summary="Prometheus, Alertmanager, node_exporter, nginx and its exporter, the controller",
    processes=(
        Process("prometheus", _prometheus, {"prometheus": 9090}, binary="/usr/bin/prometheus",
                ready_path="/-/ready", show_path="", order=10, compose=ComposeService(
                    image="PROMETHEUS_IMAGE",
                    extra={"volumes": ["./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro",
                                       "../rules:/etc/prometheus/rules:ro", "prometheus-data:/prometheus"],
                           "ports": ["127.0.0.1:9090:9090"],
                           "healthcheck": _healthcheck("http://127.0.0.1:9090/-/ready")})),
        Process("alertmanager", _alertmanager, {"alertmanager": 9093}, binary="/usr/bin/prometheus-alertmanager",
                ready_path="/-/ready", show_path="", order=20, compose=ComposeService(
                    image="ALERTMANAGER_IMAGE",
                    extra={"volumes": ["./alertmanager:/etc/alertmanager:ro", "alertmanager-data:/alertmanager"],
                           "secrets": [WEBHOOK_SECRET], "ports": ["127.0.0.1:9093:9093"],
                           "healthcheck": _healthcheck("http://127.0.0.1:9093/-/ready")})),
        Process("node_exporter", _node_exporter, {"node_exporter": 9100}, binary="/usr/bin/prometheus-node-exporter",
                order=30, compose=ComposeService(
                    image="NODE_EXPORTER_IMAGE", comment="the self-test gauge's textfile is written by the controller",
                    extra={"volumes": ["selftest-textfile:/var/lib/node_exporter/textfile_collector:ro"]})),
        Process("nginx", _nginx, {"nginx": 8080, "nginx_stub_status": 8081}, binary="/usr/sbin/nginx",
                ready_path="/stub_status", ready_port="nginx_stub_status", show_path="/", order=40,
                files=_nginx_files, compose=ComposeService(
                    image="NGINX_IMAGE", ports={"nginx": 80},
                    comment="the demo shop; its access log goes to a volume log readers follow",
                    extra={"volumes": ["./nginx/nginx.conf:/etc/nginx/nginx.conf:ro",
                                       "./nginx/html:/usr/share/nginx/html:ro", "nginx-logs:/var/log/nginx/shop"],
                           "ports": ["127.0.0.1:8080:80"]})),
        Process("nginx_exporter", _nginx_exporter, {"nginx_exporter": 9113},
                binary="/usr/bin/prometheus-nginx-exporter", order=50, compose=ComposeService(
                    image="NGINX_EXPORTER_IMAGE", extra={"depends_on": ["nginx"]})),
        Process("controller", _controller, {"controller": 9095}, ready_path="/-/ready", order=90,
                files=_controller_files, compose=ComposeService(
                    service="promreflex", comment="the Alertmanager webhook controller (promreflex controller)",
                    extra={"volumes": ["./promreflex/promreflex.yml:/etc/promreflex/promreflex.yml:ro",
                                       "promreflex-state:/var/lib/promreflex",
                                       "selftest-textfile:/var/lib/promreflex/.promreflex/stack/textfile"],
                           "secrets": [WEBHOOK_SECRET], "ports": ["127.0.0.1:9095:9095"],
                           "entrypoint": ["/bin/sh", "-c"], "healthcheck": _PROMREFLEX_HEALTH,
                           "depends_on": {"prometheus": {"condition": "service_healthy"},
                                          "alertmanager": {"condition": "service_healthy"}}})),
        Process("grafana", lambda ctx: [], {}, local=False, order=95, compose=ComposeService(
            image="GRAFANA_IMAGE", comment="the repository's generated dashboards, provisioned as they are",
            extra={"environment": {"GF_AUTH_ANONYMOUS_ENABLED": "true", "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
                                   "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH": "/var/lib/grafana/dashboards/overview.json",
                                   "GF_ANALYTICS_REPORTING_ENABLED": "false",
                                   "GF_ANALYTICS_CHECK_FOR_UPDATES": "false"},
                   "volumes": ["./grafana/provisioning:/etc/grafana/provisioning:ro",
                               "../dashboards:/var/lib/grafana/dashboards:ro", "grafana-data:/var/lib/grafana"],
                   "ports": ["127.0.0.1:3000:3000"],
                   "depends_on": {"prometheus": {"condition": "service_healthy"}}})),
    ),
    scrape_jobs=(
        Scrape("prometheus", "prometheus", "slow"),
        Scrape("alertmanager", "alertmanager", "slow"),
        Scrape("node", "node_exporter", "slow"),
        Scrape("selftest", "node_exporter", "fast", params={"collect[]": ["textfile"]},
               comment="the same node_exporter, textfile collector only, scraped fast: the self-test gauge"),
        Scrape("nginx", "nginx_exporter", "fast",
               comment="fast (200 ms, was 1 s): rules that read arrivals over 1 s need 4 samples in it"),
        Scrape("promreflex-controller", "controller", "fast"),
    ),
    routes=(
        # The self-test: `promreflex selftest fire` flips a node_exporter textfile gauge, Prometheus
        # fires PromreflexSelftest, Alertmanager posts it here, and the log action writes a line.
        {"name": "selftest-log", "matchers": ['alertname="PromreflexSelftest"'], "action": "log",
         "params": {"message": "self-test alert reached the controller"}},
        {"name": "nginx-down-log", "matchers": ['alertname="NginxDown"'], "action": "log",
         "params": {"message": "nginx stopped answering stub_status"}},
    ),
    # Watchdog always fires; repeating it every minute gives the controller a heartbeat
    # (promreflex_controller_last_notification_timestamp_seconds keeps moving). Its own
    # group_interval: Alertmanager repeats only on a group_interval tick, and under a parent
    # route at its default (5m) the heartbeat came every 5 minutes, PromreflexWatchdogNotReceived
    # (180 s, for 2m) pending in every cycle (a stranger's own Alertmanager cluster). The repeat is
    # checked on those ticks against the last send, logged a few ms after its tick: a repeat
    # interval of exactly 4 ticks comes at the 5th (every 75 s; 30s/1m gave 90 s), 50s at the 4th, with
    # 10 s for the delivery (the time logged is after it returns: a 6 s one with 55s gave 75 s).
    alertmanager_routes=({"matchers": ['alertname="Watchdog"'], "group_wait": "0s", "group_interval": "15s",
                          "repeat_interval": "50s"},),
    # A target that is down explains its own other symptoms: mute them while it lasts. The same
    # job AND instance: with the job alone, one node_exporter down muted the warnings of every
    # other host of that job in a shop's own Prometheus (a stranger's review, R5).
    inhibit_rules=({"source_matchers": ['alertname="PromreflexTargetDown"'],
                    "target_matchers": ['severity=~"warning|info"'], "equal": ["job", "instance"]},),
    rules=("stack.rules.yml", "controller.rules.yml"),
    dashboards=("overview.json",),
)
