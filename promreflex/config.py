"""One YAML file, loaded once into pydantic models.

Every problem is reported at once, each naming its key (``controller.routes[0].matchers``), so
a user fixes a configuration in one pass. Durations are written the Prometheus way (``200ms``,
``15s``, ``1m``) or as plain seconds.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from promreflex.capability import Capability, CapabilityError, check_unique, default_ports, discover
from promreflex.capability import format_duration as format_duration  # re-exported: it lived here
from promreflex.foundation import FOUNDATION
from promreflex.matchers import Matcher, parse_matchers

REPO_ROOT = Path(__file__).resolve().parent.parent

#: The embedded default configuration (``promreflex`` without ``--config.file``).
DEFAULT_CONFIG = Path(__file__).with_name("defaults.yml")

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0, "y": 365 * 86400.0}
_UNIT_ORDER = ("y", "w", "d", "h", "m", "s", "ms")


def parse_duration(value: Any) -> float:
    """``"200ms"`` -> 0.2, ``"1m"`` -> 60.0, ``"1h30m"`` -> 5400.0, ``5`` -> 5.0 (seconds).

    Strings as Prometheus and Alertmanager write durations (units y, w, d, h, m, s, ms, largest
    first, each at most once), with decimals allowed (``1.5s``); a bare number is seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like 200ms, 15s, 1m, 1h30m")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (seconds_or_none := _duration_text(value.strip())) is not None:
        seconds = seconds_or_none
    else:
        raise ValueError(f"{value!r} is not a duration (use e.g. 200ms, 15s, 1m, 1h30m)")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _duration_text(text: str) -> float | None:
    text = re.sub(r"(?<=\d)\s+(?=[a-z])", "", text)  # "15 s", as before compound durations
    if _NUMBER.fullmatch(text):
        return float(text)
    at, seconds, last = 0, 0.0, -1
    for m in _DURATION_PART.finditer(text):
        rank = _UNIT_ORDER.index(m.group(2))
        if m.start() != at or rank <= last:
            return None
        at, last = m.end(), rank
        seconds += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    return seconds if at == len(text) and at else None


Duration = Annotated[float, BeforeValidator(parse_duration)]


class Strict(BaseModel):
    """Base for configuration models: unknown keys are errors (a typo must not pass silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    if int(port) > 65535:
        raise ValueError(f"{address!r}: port {port} is above 65535")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def _valid_address(value: str) -> str:
    split_host_port(value)
    return value


ListenAddress = Annotated[str, AfterValidator(_valid_address)]
"""``HOST:PORT`` (``[::1]:9095`` for IPv6); validated when the configuration loads."""


def find_duplicates(values: list[str]) -> list[str]:
    """The values that occur more than once, sorted (for "must be unique" checks)."""
    return sorted({v for v in values if values.count(v) > 1})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Route(Strict):
    """Alerts matching every matcher run ``action`` with ``params``."""

    name: str = Field(pattern=r"^[a-zA-Z0-9_.-]+$")
    matchers: list[str] = Field(min_length=1)
    action: str
    params: dict[str, Any] = Field(default_factory=dict)
    cooldown: Duration = 0.0
    # How long one fire/resolve may run before it is cancelled and counted as failed (default:
    # the action's own ``timeout``), and how many times a failed transition is retried (with
    # exponential backoff and full jitter) before the controller gives up on it.
    timeout: Duration | None = Field(default=None, gt=0)
    max_retries: int = Field(default=5, ge=0)

    @field_validator("matchers")
    @classmethod
    def _matchers_parse(cls, value: list[str]) -> list[str]:
        for m in value:
            parse_matchers(m)
        return value

    def parsed_matchers(self) -> list[Matcher]:
        """Every matcher of every item (an item may hold several, as in Alertmanager)."""
        return [m for item in self.matchers for m in parse_matchers(item)]


class Owner(Strict):
    """A host agent's targets: it acts only on alerts whose ``label`` equals its value (a fleet:
    one agent per host, each pausing only its own host's copies), and with ``match_absent`` on
    alerts that do not carry the label at all. ``value_from_env`` names an
    environment variable to read the value from at start (``NODE_NAME`` from the Kubernetes
    downward API, or the host name), so one configuration file serves every host."""

    label: str = Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    value: str | None = Field(default=None, min_length=1)
    value_from_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # An alert without the label is every agent's too: the copy guard's alerts are per site
    # (summed over the site's nginx targets, their node labels dropped), and each node's agent
    # then pauses the copies registered on its own node for that site (the Kubernetes agents).
    match_absent: bool = False

    @model_validator(mode="after")
    def _one_value(self) -> Owner:
        if (self.value is None) == (self.value_from_env is None):
            raise ValueError("set exactly one of value and value_from_env")
        if self.value_from_env is not None and not os.environ.get(self.value_from_env):
            raise ValueError(f"value_from_env: the environment variable {self.value_from_env} is not set (or empty)")
        return self

    def resolved(self) -> str:
        if self.value is not None:
            return self.value
        assert self.value_from_env is not None
        return os.environ[self.value_from_env]


class ControllerConfig(Strict):
    listen_address: ListenAddress = "127.0.0.1:9095"
    # One Alertmanager, or every peer of a cluster (a list): reads fail over between them.
    alertmanager_url: str | list[str] | None = "http://127.0.0.1:9093"
    # One Prometheus, or both replicas of a pair (a list): queries fail over between them.
    prometheus_url: str | list[str] | None = "http://127.0.0.1:9090"
    token_file: Path | None = None
    reconcile_interval: Duration = 15.0
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    audit_log: Path = Path(".promreflex/audit.jsonl")
    state_file: Path = Path(".promreflex/controller-state.db")  # SQLite (WAL); an old JSON file is imported
    dedupe_window: Duration = 3600.0
    # The reconciliation (README "How the controller behaves"): the Alertmanager receiver that
    # notifies this controller (the stack's generated configuration names it "promreflex"; a
    # list when several receivers post here, one per team or one with its own max_alerts; an
    # empty value, or names Alertmanager does not know, reads every alert); how long a
    # restarted Alertmanager peer's empty listing is not taken as proof that an alert ended
    # (Prometheus re-sends after --rules.alert.resend-delay, 1m, plus an evaluation); how long
    # an alert must have been active before the reconciliation alone fires it (group_wait).
    alertmanager_receiver: str | list[Annotated[str, Field(min_length=1)]] | None = "promreflex"
    alertmanager_restart_grace: Duration = 120.0
    reconcile_fire_after: Duration = 0.0
    # Set on a host agent: only alerts for this host's targets reach its routes (see Owner).
    owner: Owner | None = None
    routes: list[Route] = Field(default_factory=list)

    @model_validator(mode="after")
    def _token_beyond_loopback(self) -> ControllerConfig:
        host, _ = split_host_port(self.listen_address)
        if not is_loopback(host) and self.token_file is None:
            raise ValueError(
                f"listen_address {self.listen_address} is beyond loopback: set token_file "
                "(a bearer token Alertmanager sends with http_config.authorization)"
            )
        dupes = find_duplicates([r.name for r in self.routes])
        if dupes:
            raise ValueError(f"route names must be unique: {', '.join(dupes)}")
        return self


class PortsBase(Strict):
    """``stack.ports``: one field per named port of every process (see :func:`config_model`).
    Each must be its own (``StackConfig``): two components on one port start "ready" (the
    second's readiness probe answered by the first) while the second cannot listen."""


class ScrapeJob(Strict):
    """An extra scrape job of the local stack (a capability's exporter, a benchmark's target)."""

    job: str = Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_-]*$")
    targets: list[ListenAddress] = Field(min_length=1)
    interval: Duration | None = None  # default: stack.fast_interval
    metrics_path: str = "/metrics"


def _http_url(value: str | None) -> str | None:
    if value is not None and not re.match(r"^https?://[^/\s]+(/\S*)?$", value):
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value


HttpUrl = Annotated[str | None, AfterValidator(_http_url)]


class NginxConfig(Strict):
    """``stack.nginx``: the stack's own nginx (default), or one that already runs.

    ``external: true``: the stack starts no nginx; the nginx exporter scrapes ``stub_status_url``
    and the access-log exporter follows ``access_log`` (written by that nginx in the promreflex
    format, ``NGINX_LOG_FORMAT``). ``url`` is the shop as visitors reach it (what ``promreflex
    calibrate`` loads by default); default: the origin of ``stub_status_url``."""

    external: bool = False
    url: HttpUrl = None
    stub_status_url: HttpUrl = None
    access_log: Path | None = None

    @model_validator(mode="after")
    def _external_needs_its_sources(self) -> NginxConfig:
        if self.external:
            missing = [k for k in ("stub_status_url", "access_log") if getattr(self, k) is None]
            if missing:
                raise ValueError(f"external: true needs {' and '.join(missing)} (where that nginx serves stub_status "
                                 "and writes its access log)")
            if self.access_log is not None and not self.access_log.is_absolute():
                raise ValueError(f"access_log {self.access_log} must be an absolute path")
        else:
            given = [k for k in ("url", "stub_status_url", "access_log") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} only apply with external: true (the stack's own nginx has its own)")
        return self

    @property
    def site_url(self) -> str | None:
        if self.url:
            return self.url
        if self.stub_status_url:
            parts = self.stub_status_url.split("/", 3)
            return "/".join(parts[:3]) + "/"
        return None


#: The named ports of the stack's own nginx (the foundation's): unused with ``nginx.external``.
OWN_NGINX_PORTS = ("nginx", "nginx_stub_status")


class StackConfig(Strict):
    """The local stack that ``promreflex stack up`` runs on loopback."""

    host: str = "127.0.0.1"
    ports: PortsBase = PortsBase()
    state_dir: Path = Path(".promreflex/stack")
    rules_dir: Path = REPO_ROOT / "rules"
    site_dir: Path = REPO_ROOT / "compose" / "nginx" / "html"
    fast_interval: Duration = 0.2
    slow_interval: Duration = 5.0
    resend_delay: Duration = 1.0
    group_interval: Duration = 0.2
    upstream: ListenAddress | None = None  # nginx proxies / to this backend instead of serving site_dir
    extra_scrape: list[ScrapeJob] = Field(default_factory=list)
    nginx: NginxConfig = NginxConfig()  # external: true guards an nginx that already runs

    @model_validator(mode="after")
    def _upstream_is_for_our_nginx(self) -> StackConfig:
        if self.nginx.external and self.upstream is not None:
            raise ValueError("upstream configures the stack's own nginx; with nginx.external: true there is none")
        return self

    @model_validator(mode="after")
    def _distinct_ports(self) -> StackConfig:
        unused = OWN_NGINX_PORTS if self.nginx.external else ()  # no nginx of ours listens on them
        by_port: dict[int, list[str]] = {}
        for name, port in self.ports.model_dump().items():
            if isinstance(port, int) and port > 0 and name not in unused:
                by_port.setdefault(port, []).append(name)
        shared = [f"{port} ({', '.join(names)})" for port, names in by_port.items() if len(names) > 1]
        if shared:
            raise ValueError(f"ports: each component needs its own port; shared: {'; '.join(shared)}")
        return self

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, value: str) -> str:
        if not is_loopback(value):
            raise ValueError("the local stack binds loopback only (127.0.0.0/8 or ::1)")
        return value


class Config(Strict):
    """The static part of the configuration; :func:`config_model` adds ``stack.ports`` and one
    section per capability (``Config`` is the base class of every model it builds)."""

    controller: ControllerConfig = ControllerConfig()
    stack: StackConfig = StackConfig()


def all_capabilities(capabilities: Sequence[Capability] | None = None) -> tuple[Capability, ...]:
    """The foundation followed by ``capabilities`` (default: the installed ones, discovered)."""
    caps = (FOUNDATION, *(discover() if capabilities is None else capabilities))
    check_unique(caps)
    return caps


@functools.lru_cache(maxsize=32)
def _model(caps: tuple[Capability, ...]) -> type[Config]:
    port_fields: dict[str, Any] = {name: (int, Field(default=port, gt=0, lt=65536))
                                   for name, port in default_ports(caps).items()}
    ports = create_model("Ports", __base__=PortsBase, **port_fields)
    stack = create_model("StackConfig", __base__=StackConfig, ports=(ports, ports()))
    sections: dict[str, Any] = {
        cap.config_section: (cap.config_model, cap.config_model())
        for cap in caps if cap.config_section and cap.config_model
    }
    for name in sections:
        if name in Config.model_fields:
            raise CapabilityError(f"a capability's config section cannot be called {name!r} (the core's)")
    return create_model("Config", __base__=Config, stack=(stack, stack()), **sections)


def config_model(capabilities: Sequence[Capability] | None = None) -> type[Config]:
    """The whole configuration model: ``controller``, ``stack`` with one ``stack.ports`` field
    per named port of every process, and one top-level section per capability that has one."""
    return _model(all_capabilities(capabilities))


def ports_model(capabilities: Sequence[Capability] | None = None) -> type[BaseModel]:
    """The ``stack.ports`` model: ``{p: free_port() for p in ports_model().model_fields}``."""
    return config_model(capabilities).model_fields["stack"].annotation.model_fields["ports"].annotation  # type: ignore[union-attr]


def __getattr__(name: str) -> Any:
    # ``Ports`` was a static class naming every port; it is now built from the manifests.
    if name == "Ports":
        return ports_model()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ConfigError(Exception):
    """A configuration file that cannot be used; ``problems`` lists every one, naming its key."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def validation_problems(err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        problems.append(f"{_loc(e['loc'])}: {msg}")
    return problems


M = TypeVar("M", bound=BaseModel)


class _StrictLoader(yaml.SafeLoader):
    """YAML as Prometheus and Alertmanager read it (Go's yaml, strict): a key given twice in one
    mapping is an error. PyYAML keeps the last one: a second ``controller:`` pasted below the
    first replaced its routes and token with the defaults, and a repeated ``matchers:`` the first,
    while check-config said OK."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    """The keys written in the mapping itself, each once (on one line, ``{a: 1, a: 2}``, too);
    what a merge key (``<<: *base``) brings in may be overridden, as YAML means it."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:
            continue  # an unhashable key: construct_mapping says so
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice in one mapping (first on line {first})", key_node.start_mark)
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def read_yaml_mapping(path: str | Path, top_level_hint: str) -> dict[str, Any]:
    """Read a YAML file whose top level must be a mapping (a key given twice in a mapping is an
    error, as in Prometheus' and Alertmanager's files); ConfigError otherwise."""
    source = str(path)
    try:
        raw = yaml.load(Path(path).read_text(), Loader=_StrictLoader)  # noqa: S506 - a SafeLoader
    except OSError as e:
        raise ConfigError(source, [f"cannot read: {e.strerror}"]) from e
    except UnicodeDecodeError as e:
        raise ConfigError(source, [f"not UTF-8 text (byte {e.start}: {e.reason})"]) from e
    except yaml.YAMLError as e:
        raise ConfigError(source, [f"not valid YAML: {e}"]) from e
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(source, [f"the top level must be a mapping ({top_level_hint})"])
    return raw


def validate_model(model: type[M], data: dict[str, Any], source: str) -> M:
    """Validate once; every problem in one ConfigError, each naming its key."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, validation_problems(e)) from e


def load_model(path: str | Path, model: type[M], top_level_hint: str) -> M:
    """Load a YAML configuration file into ``model`` (used by every promreflex component)."""
    return validate_model(model, read_yaml_mapping(path, top_level_hint), str(path))


def default_routes(capabilities: Sequence[Capability] | None = None) -> list[dict[str, Any]]:
    """The controller routes every manifest brings (foundation first)."""
    return [dict(route) for cap in all_capabilities(capabilities) for route in cap.routes]


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                capabilities: Sequence[Capability] | None = None) -> Config:
    """Load the YAML file at ``path``, apply ``overrides``, validate once.

    ``path=None`` is the models' defaults (no controller routes). A file (the embedded
    :data:`DEFAULT_CONFIG` or the user's) that does not mention ``controller.routes`` gets the
    manifests' default routes, so a file that only moves ports keeps the self-test and every
    capability's route; ``routes: []`` means none.
    ``capabilities`` replaces the discovered ones (tests pass a throwaway capability).
    """
    data = read_yaml_mapping(path, "controller:, stack:, or a capability's section") if path is not None else {}
    controller = data.get("controller")
    if path is not None and (controller is None or (isinstance(controller, dict) and "routes" not in controller)):
        data["controller"] = {**(controller or {}), "routes": default_routes(capabilities)}
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return validate_model(config_model(capabilities), data, str(path) if path else "(defaults)")
