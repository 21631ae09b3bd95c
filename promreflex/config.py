"""One YAML file, loaded once into pydantic models.

Every problem is reported at once, each naming its key (``controller.routes[0].matchers``), so
a user fixes a configuration in one pass. Durations are written the Prometheus way (``200ms``,
``15s``, ``1m``) or as plain seconds.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from typing import TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from promreflex.matchers import Matcher, parse_matcher

REPO_ROOT = Path(__file__).resolve().parent.parent

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """``"200ms"`` -> 0.2, ``"1m"`` -> 60.0, ``5`` -> 5.0 (seconds)."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like 200ms, 15s, 1m")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration (use e.g. 200ms, 15s, 1m)")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def format_duration(seconds: float) -> str:
    """The Prometheus spelling of a duration: 0.2 -> ``200ms``, 60 -> ``1m``."""
    ms = round(seconds * 1000)
    if ms % 60000 == 0 and ms:
        return f"{ms // 60000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


Duration = Annotated[float, BeforeValidator(parse_duration)]


class Strict(BaseModel):
    """Base for configuration models: unknown keys are errors (a typo must not pass silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
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

    @field_validator("matchers")
    @classmethod
    def _matchers_parse(cls, value: list[str]) -> list[str]:
        for m in value:
            parse_matcher(m)
        return value

    def parsed_matchers(self) -> list[Matcher]:
        return [parse_matcher(m) for m in self.matchers]


class ControllerConfig(Strict):
    listen_address: ListenAddress = "127.0.0.1:9095"
    alertmanager_url: str | None = "http://127.0.0.1:9093"
    prometheus_url: str | None = "http://127.0.0.1:9090"
    token_file: Path | None = None
    reconcile_interval: Duration = 15.0
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    audit_log: Path = Path(".promreflex/audit.jsonl")
    state_file: Path = Path(".promreflex/controller-state.json")
    dedupe_window: Duration = 3600.0
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


class Ports(Strict):
    prometheus: int = 9090
    alertmanager: int = 9093
    node_exporter: int = 9100
    nginx: int = 8080
    nginx_stub_status: int = 8081
    nginx_exporter: int = 9113
    accesslog_exporter: int = 9181
    controller: int = 9095


class ScrapeJob(Strict):
    """An extra scrape job of the local stack (a capability's exporter, a benchmark's target)."""

    job: str = Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_-]*$")
    targets: list[ListenAddress] = Field(min_length=1)
    interval: Duration | None = None  # default: stack.fast_interval
    metrics_path: str = "/metrics"


class StackConfig(Strict):
    """The local stack that ``promreflex stack up`` runs on loopback."""

    host: str = "127.0.0.1"
    ports: Ports = Ports()
    state_dir: Path = Path(".promreflex/stack")
    rules_dir: Path = REPO_ROOT / "rules"
    site_dir: Path = REPO_ROOT / "compose" / "nginx" / "html"
    fast_interval: Duration = 0.2
    slow_interval: Duration = 5.0
    resend_delay: Duration = 1.0
    group_interval: Duration = 0.2
    site: str = Field(default="shop", pattern=r"^[a-zA-Z0-9_.-]+$")  # the access-log exporter's site label
    upstream: ListenAddress | None = None  # nginx proxies / to this backend instead of serving site_dir
    extra_scrape: list[ScrapeJob] = Field(default_factory=list)

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, value: str) -> str:
        if not is_loopback(value):
            raise ValueError("the local stack binds loopback only (127.0.0.0/8 or ::1)")
        return value


class Config(Strict):
    controller: ControllerConfig = ControllerConfig()
    stack: StackConfig = StackConfig()


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


def read_yaml_mapping(path: str | Path, top_level_hint: str) -> dict[str, Any]:
    """Read a YAML file whose top level must be a mapping; ConfigError otherwise."""
    source = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(source, [f"cannot read: {e.strerror}"]) from e
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


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Load the YAML file at ``path`` (or the defaults), apply ``overrides``, validate once."""
    data = read_yaml_mapping(path, "controller:, stack:") if path is not None else {}
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return validate_model(Config, data, str(path) if path else "(defaults)")
