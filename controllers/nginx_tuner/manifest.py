"""The nginx keepalive tuner's manifest: ``promreflex tune-nginx`` and
``exporter-nginx-memory``, the nginx latency/memory rules and the tuner's dashboard. Its
``retune-nginx`` action has no default route: it needs the nginx it may reload (see README)."""

from promreflex.capability import Capability, lazy

CAPABILITY = Capability(
    name="nginx_tuner",
    summary="sweep nginx keepalive_timeout and apply the Pareto choice; nginx memory exporter",
    cli=(lazy("controllers.nginx_tuner.cli:register"),),
    rules=("nginx.rules.yml",),
    host_actions=("retune-nginx",),
    dashboards=("nginx_tuner.json",),
)
