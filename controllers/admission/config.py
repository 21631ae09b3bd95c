"""The ``admission:`` configuration section (one YAML file, validated once, every problem by key).

The proxy reads only this section of the file (``promreflex check-config`` validates the whole
file once the capability is installed); flags override single keys.

**Waits follow the visitors' patience.** ``session.client_timeout`` is how long a visitor waits
for one page before giving up (a browser about a minute, people sooner: the default is the
paper's 60 s). Two defaults are derived from it rather than fixed, so they stay right when an
operator states their visitors' patience, or a bench scales time:

- ``session.max_queue_wait`` = ``client_timeout / 2`` (:data:`QUEUE_WAIT_SHARE`): a new visitor
  who has not been admitted within half their patience gets the waiting-room page (503,
  Retry-After) while still there. Waiting longer would only admit sessions whose first page then
  has less time than it needs before the client gives up: a failure at page 1 anyway, after the
  app has done the work.
- ``session_scheduler.page_wait_target`` = ``client_timeout / 6`` (:data:`PAGE_WAIT_SHARE`,
  10 s of a 60 s timeout): an admitted session's request that waits this long in a page queue
  slows admission. The signal must come while the waits are still well inside the client's
  patience, because the sessions already admitted keep arriving at the pages for a session's
  length after admission slows. The ratio is the one the bench ran with (1 s of its scaled 6 s
  timeout) when the full scheme held its peak at 4x saturation with failures only at the first
  page; the former fixed 5 s was, at the bench's time scale 0.1, the paper's 50 s: a signal that
  came only when clients were already leaving.

An explicit value of either key wins over the derived one.
"""

from __future__ import annotations

import urllib.parse

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from promreflex.config import (
    ConfigError,
    Duration,
    ListenAddress,
    Strict,
    find_duplicates,
    is_loopback,
    parse_duration,
    read_yaml_mapping,
    split_host_port,
    validation_problems,
)

NAME = r"^[a-z][a-z0-9_]{0,31}$"

#: A browser gives up on a page after about a minute (the paper's client timeout).
CLIENT_TIMEOUT = 60.0
#: ``session.max_queue_wait`` defaults to this share of ``session.client_timeout``.
QUEUE_WAIT_SHARE = 0.5
#: ``session_scheduler.page_wait_target`` defaults to this share of ``session.client_timeout``.
PAGE_WAIT_SHARE = 1 / 6


def _client_timeout(session: Any) -> float | None:
    """``session.client_timeout`` from raw input (a mapping or a model); None when it is not a
    valid positive duration (its own validator then names the problem)."""
    if isinstance(session, Session):
        return session.client_timeout
    if session is None:
        return CLIENT_TIMEOUT
    if not isinstance(session, dict):
        return None
    try:
        value = parse_duration(session.get("client_timeout", CLIENT_TIMEOUT))
    except ValueError:
        return None
    return value if value > 0 else None


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as e:
        raise ValueError(f"{value!r} is not a regular expression: {e}") from None
    return value


def _ordered(model: Any, low: str, mid: str, high: str) -> Any:
    if not getattr(model, low) <= getattr(model, mid) <= getattr(model, high):
        raise ValueError(f"need {low} <= {mid} <= {high}")
    return model


class Page(Strict):
    """A page class: the paths it covers and how long the app may take for one of them."""

    name: str = Field(pattern=NAME, description="the `page` label (bounded: one per class)")
    pattern: str = Field(description="regular expression searched in the request's normalised path (decoded, "
                                     "dot segments resolved, empty segments merged; no query string)")
    query: str | None = Field(default=None, description="regular expression searched in the query string (after "
                                                        "`?`) as the client sent it or percent-decoded as the app "
                                                        "reads it: the class needs both to match (apps that route "
                                                        "by the query: DokuWiki's `do=logout`, WordPress' "
                                                        "`action=logout`)")
    timeout: Duration | None = Field(default=None, gt=0, description="upstream timeout (default page_scheduler.timeout)")
    logout: bool = Field(default=False, description="a served request of this class ends the session (completed)")

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str) -> str:
        if "\\?" in value or "[?]" in value:
            # (a review: `/doku\.php\?do=logout` was accepted and never matched anything)
            raise ValueError(f"{value!r} looks for a `?`, but `pattern` is searched in the path only (no query "
                             "string): put what follows the `?` in `query`, e.g. pattern: '^/doku\\.php$', "
                             "query: '(^|&)do=logout(&|$)'")
        return _regex(value)

    @field_validator("query")
    @classmethod
    def _query(cls, value: str | None) -> str | None:
        return None if value is None else _regex(value)


class PageScheduler(Strict):
    """Progress-based regulation of each page class' concurrency limit (``sched.Regulator``)."""

    enabled: bool = True
    initial_limit: int = Field(default=4, ge=1)
    min_limit: int = Field(default=1, ge=1)
    max_limit: int = Field(default=256, ge=1)
    window: Duration = Field(default=1.0, gt=0, description="a regulation window lasts at least this long")
    min_completions: int = Field(default=20, ge=1,
                                 description="served requests a window (and a probe) needs before it is judged")
    improvement: float = Field(default=0.05, ge=0, le=1,
                               description="a raise must bring this much more throughput (beyond the noise); a "
                                           "lowering may cost at most this much")
    hold_windows: int = Field(default=5, ge=0, description="windows to stay after a failed probe before the next")
    queue_capacity: int = Field(default=1000, ge=0)
    max_queue_wait: Duration = Field(default=30.0, gt=0)
    timeout: Duration = Field(default=30.0, gt=0)

    _order = model_validator(mode="after")(lambda self: _ordered(self, "min_limit", "initial_limit", "max_limit"))


class Session(Strict):
    cookie_name: str = Field(default="promreflex_session", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # The cookie's Path: a shop mounted under a sub-path of its host (nginx `location /shop/`)
    # sets it to that path, and two proxies on one host give their cookies different names:
    # with the same name at Path=/ each visit to one shop ended the session at the other.
    cookie_path: str = Field(default="/", pattern=r"^/[A-Za-z0-9._~!$&'()*+,=:@%/-]{0,255}$")
    key_file: Path | None = None
    cookie_secure: bool = False
    # Lax: the browser sends the cookie on a top-level GET from another site, not on a cross-site
    # POST. A shop whose buyers come back by a cross-site POST (3-D Secure, a payment page, SAML,
    # OIDC form_post) sets None (with cookie_secure: browsers refuse SameSite=None otherwise) or
    # lists those return paths in `exempt`: else the return is a new session, queued in a crowd.
    cookie_samesite: Literal["Lax", "Strict", "None"] = "Lax"
    idle_timeout: Duration = Field(default=120.0, gt=0)
    max_age: Duration = Field(default=4 * 3600.0, gt=0)
    # Requests of one session at once, queued ones included (429 beyond): a copied cookie's
    # reach. Above what one page load sends: over HTTP/2 a browser sends every subresource at once
    # (nginx allows 128 streams), and with 8 a product list of 24 thumbnails the app serves lost 16
    # to 429 (a stranger's review); over HTTP/1.1 a browser keeps 6 connections per host. Not much
    # above it either: the page queues are FIFO, and each queued request of one session delays the
    # others by its share of the page's time (with 64, another visitor waited 3.65 s for 0.59 s).
    max_in_flight: int = Field(default=32, ge=1)
    queue_capacity: int = Field(default=500, ge=0)
    client_timeout: Duration = Field(default=CLIENT_TIMEOUT, gt=0,
                                     description="how long a visitor waits for one page before giving up; "
                                                 "the waits below default to shares of it")
    max_queue_wait: Duration = Field(default=CLIENT_TIMEOUT * QUEUE_WAIT_SHARE, gt=0,
                                     description="a new session waits at most this long for admission, then "
                                                 "gets the waiting-room page (default client_timeout / 2)")
    readmit_after_restart: bool = True
    max_sessions: int = Field(default=100_000, ge=1, description="tracked sessions at most (memory bound)")

    @model_validator(mode="after")
    def _samesite_none_needs_secure(self) -> Session:
        if self.cookie_samesite == "None" and not self.cookie_secure:
            raise ValueError("cookie_samesite None needs cookie_secure: true (browsers drop a SameSite=None cookie "
                             "that is not Secure)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _derived_wait(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("max_queue_wait") is None:
            timeout = _client_timeout(data)
            if timeout is not None:
                data = {**data, "max_queue_wait": timeout * QUEUE_WAIT_SHARE}
        return data


class SessionScheduler(Strict):
    """The admission interval, adapted once per ``period`` (``sched.SessionScheduler``)."""

    enabled: bool = True
    queue_threshold: float = Field(default=10.0, ge=0,
                                   description="total page-queue length (period mean) the scheduler keeps under")
    period: Duration = Field(default=1.0, gt=0, description="control period of the admission interval")
    gain: float = Field(default=0.3, gt=0, le=2,
                        description="admission rate = departure rate x (1 + gain x queue error), per period")
    page_wait_target: Duration = Field(default=CLIENT_TIMEOUT * PAGE_WAIT_SHARE, gt=0,
                                       description="an admitted session's page-queue wait above this slows admission "
                                                   "(default session.client_timeout / 6)")
    initial_interval: Duration = Field(default=0.1, ge=0)
    min_interval: Duration = Field(default=0.001, ge=0)
    max_interval: Duration = Field(default=10.0, gt=0)
    increase: float = Field(default=1.5, gt=1, description="the interval grows at most this much per period")
    decrease: float = Field(default=0.8, gt=0, lt=1, description="the interval shrinks at most this much per period")

    _order = model_validator(mode="after")(
        lambda self: _ordered(self, "min_interval", "initial_interval", "max_interval"))


class Control(Strict):
    listen_address: ListenAddress = "127.0.0.1:9188"
    token_file: Path | None = None
    max_lease: Duration = Field(default=600.0, gt=0)
    holds_file: Path | None = Field(default=None, description="where the holds are kept (written at each change, "
                                    "atomically; read at start, expired ones dropped): a restarted proxy keeps a "
                                    "waiting room or a cap set by hand or by the controller. Unset: in memory only")

    @model_validator(mode="after")
    def _token(self) -> Control:
        host, _ = split_host_port(self.listen_address)
        if not is_loopback(host) and self.token_file is None:
            raise ValueError(f"listen_address {self.listen_address} is beyond loopback: set token_file")
        return self


class Alerts(Strict):
    """Thresholds the rules read as named series (promreflex_admission_*_threshold)."""

    abandon_ratio: float = Field(default=0.1, gt=0, le=1)


class AdmissionSection(Strict):
    listen_address: ListenAddress = "127.0.0.1:8088"
    upstream: str = Field(default="http://127.0.0.1:8000", pattern=r"^http://[^/?#@]+/?$",
                          description="the app: http://HOST:PORT")
    exempt: list[str] = Field(default_factory=list)
    pages: list[Page] = Field(default_factory=list)
    # How long an idle connection to the app is kept for reuse: below the app's own keep-alive
    # timeout (gunicorn 2 s, Node and uvicorn 5 s), as with nginx's upstream keepalive_timeout,
    # or a POST sent as the app closes the connection fails (502: 2 of 42 against a 2 s app with
    # 30 s here, a review). Under load a connection is never idle that long; a quiet one costs
    # a loopback reconnect.
    upstream_keepalive: Duration = Field(default=1.5, gt=0)
    default_page: str = Field(default="other", pattern=NAME)
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop", description="uvloop (libuv; 9-16 % less proxy CPU per request than asyncio's own loop, "
                                      "measured at 1,000 req/s) or asyncio; uvloop falls back to asyncio when it is "
                                      "not installed (--no-uvloop: asyncio)")
    page_scheduler: PageScheduler = PageScheduler()
    session: Session = Session()
    session_scheduler: SessionScheduler = SessionScheduler()
    control: Control = Control()
    alerts: Alerts = Alerts()

    @model_validator(mode="before")
    @classmethod
    def _derived_page_wait(cls, data: Any) -> Any:
        """``session_scheduler.page_wait_target`` from ``session.client_timeout`` unless given."""
        if not isinstance(data, dict):
            return data
        timeout = _client_timeout(data.get("session"))
        ss = data.get("session_scheduler")
        if timeout is None:
            return data
        target = timeout * PAGE_WAIT_SHARE
        if ss is None:
            return {**data, "session_scheduler": {"page_wait_target": target}}
        if isinstance(ss, dict) and ss.get("page_wait_target") is None:
            return {**data, "session_scheduler": {**ss, "page_wait_target": target}}
        if isinstance(ss, SessionScheduler) and "page_wait_target" not in ss.model_fields_set:
            return {**data, "session_scheduler": ss.model_copy(update={"page_wait_target": target})}
        return data

    @field_validator("upstream")
    @classmethod
    def _upstream_port(cls, value: str) -> str:
        try:
            port = urllib.parse.urlsplit(value).port  # ValueError above 65535 or not a number
        except ValueError as e:
            raise ValueError(f"{value!r}: {e}") from None
        if port == 0:
            raise ValueError(f"{value!r}: port 0 is not an address to connect to")
        return value

    @field_validator("exempt")
    @classmethod
    def _exempt(cls, value: list[str]) -> list[str]:
        return [_regex(v) for v in value]

    @model_validator(mode="after")
    def _names(self) -> AdmissionSection:
        names = [p.name for p in self.pages] + [self.default_page]
        dupes = find_duplicates(names)
        if dupes:
            raise ValueError(f"page names must be unique (default_page included): {', '.join(dupes)}")
        return self

    def page_names(self) -> list[str]:
        return [p.name for p in self.pages] + [self.default_page]


def load_section(path: Path | None, overrides: dict[str, Any] | None = None) -> AdmissionSection:
    """The ``admission:`` section of ``path`` (other sections are left to ``check-config``),
    with dotted ``overrides`` applied (the command-line flags); ConfigError names every problem,
    and the flag behind one that concerns a key a flag set."""
    data: dict[str, Any] = {}
    source = "the command-line flags" if overrides else "(defaults)"
    if path is not None:
        raw = read_yaml_mapping(path, "admission: and the other sections")
        section = raw.get("admission") or {}
        if not isinstance(section, dict):
            raise ConfigError(str(path), ["admission: must be a mapping"])
        data, source = section, (f"{path} and the command-line flags" if overrides else str(path))
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    try:
        return AdmissionSection.model_validate(data)
    except ValidationError as e:
        problems = [p.replace("(top level)", "admission", 1) if p.startswith("(top level)") else f"admission.{p}"
                    for p in validation_problems(e)]
        raise ConfigError(source, [_flagged(p, overrides or {}) for p in problems]) from e


def _flagged(problem: str, overrides: dict[str, Any]) -> str:
    """``problem`` (``admission.KEY: why``), naming the command-line flag's key when it concerns a
    key a flag set (at it, or above it: a check across a section's keys)."""
    where = problem.split(":", 1)[0]
    keys = [f"admission.{k}" for k in overrides]
    keys = [k for k in keys if k == where or k.startswith(where + ".") or where.startswith(k + ".")]
    return f"{problem} (from the command line: {', '.join(keys)})" if keys else problem
