"""The ``admission:`` section: a valid example, and an invalid one whose every problem is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from controllers.admission.cli import _overrides, register
from controllers.admission.config import load_section
from promreflex.config import ConfigError

VALID = """
controller: {listen_address: 127.0.0.1:9095}
admission:
  upstream: http://127.0.0.1:8000
  exempt: ['^/static/']
  pages:
    - {name: login, pattern: '^/login'}
    - {name: search, pattern: '^/search', timeout: 1m}
    - {name: logout, pattern: '^/logout', logout: true}
  page_scheduler: {initial_limit: 2, window: 500ms}
  session: {idle_timeout: 90s, cookie_secure: true}
  session_scheduler: {queue_threshold: 5, max_interval: 5s}
"""

INVALID = """
admission:
  upstream: https://shop.example/x
  pages:
    - {name: login, pattern: '^/login('}
    - {name: login, pattern: '^/x', timeot: 1s}
  page_scheduler: {initial_limit: 0}
  session_scheduler: {increase: 0.5, min_interval: 5s, initial_interval: 1s}
  control: {listen_address: 0.0.0.0:9188}
"""


def test_valid_example(tmp_path: Path):
    f = tmp_path / "promreflex.yml"
    f.write_text(VALID)
    cfg = load_section(f)
    assert [p.name for p in cfg.pages] == ["login", "search", "logout"]
    assert cfg.pages[1].timeout == 60 and cfg.pages[2].logout
    assert cfg.page_scheduler.window == 0.5 and cfg.session.idle_timeout == 90
    assert cfg.page_names() == ["login", "search", "logout", "other"]


def test_defaults_make_a_valid_section():
    cfg = load_section(None)
    assert cfg.listen_address == "127.0.0.1:8088" and cfg.control.listen_address == "127.0.0.1:9188"


def test_invalid_example_names_every_problem(tmp_path: Path):
    f = tmp_path / "bad.yml"
    f.write_text(INVALID)
    with pytest.raises(ConfigError) as err:
        load_section(f)
    text = "\n".join(err.value.problems)
    for needle in ("admission.upstream", "admission.pages[0].pattern", "admission.pages[1].timeot",
                   "admission.page_scheduler.initial_limit", "admission.session_scheduler.increase",
                   "admission.control"):
        assert needle in text, (needle, text)
    assert "beyond loopback" in text


def test_duplicate_page_names_including_the_default(tmp_path: Path):
    f = tmp_path / "dup.yml"
    f.write_text("admission:\n  pages: [{name: other, pattern: '^/o'}]\n")
    with pytest.raises(ConfigError, match="unique"):
        load_section(f)


def test_flags_override_the_file(tmp_path: Path):
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["admission", "proxy", "--upstream", "http://127.0.0.1:9000",
                              "--web.listen-address", "127.0.0.1:7000", "--no-session-scheduler"])
    cfg = load_section(None, _overrides(args))
    assert cfg.upstream == "http://127.0.0.1:9000" and cfg.listen_address == "127.0.0.1:7000"
    assert cfg.session_scheduler.enabled is False and cfg.page_scheduler.enabled is True


def test_waits_default_to_shares_of_the_client_timeout(tmp_path: Path):
    """The session queue wait and the page-wait target follow the visitors' patience, and an
    explicit value wins (YAML and models alike)."""
    from controllers.admission.config import AdmissionSection, Session, SessionScheduler

    cfg = load_section(None)
    assert cfg.session.client_timeout == 60
    assert cfg.session.max_queue_wait == 30 and cfg.session_scheduler.page_wait_target == 10
    f = tmp_path / "patience.yml"
    f.write_text("admission:\n  session: {client_timeout: 30s}\n  session_scheduler: {queue_threshold: 5}\n")
    cfg = load_section(f)
    assert cfg.session.max_queue_wait == 15 and cfg.session_scheduler.page_wait_target == 5
    assert cfg.session_scheduler.queue_threshold == 5
    cfg = load_section(f, {"session.max_queue_wait": "20s", "session_scheduler.page_wait_target": 2})
    assert cfg.session.max_queue_wait == 20 and cfg.session_scheduler.page_wait_target == 2
    section = AdmissionSection(session=Session(client_timeout=12))
    assert section.session.max_queue_wait == 6 and section.session_scheduler.page_wait_target == 2
    section = AdmissionSection(session=Session(client_timeout=12), session_scheduler=SessionScheduler(page_wait_target=7))
    assert section.session_scheduler.page_wait_target == 7


def test_a_bad_client_timeout_is_named_once(tmp_path: Path):
    f = tmp_path / "bad.yml"
    f.write_text("admission:\n  session: {client_timeout: soon}\n")
    with pytest.raises(ConfigError) as err:
        load_section(f)
    assert err.value.problems == [p for p in err.value.problems if "client_timeout" in p]
    assert len(err.value.problems) == 1


def test_event_loop_is_uvloop_unless_turned_off():
    import argparse
    import asyncio

    from controllers.admission.cli import loop_factory

    assert load_section(None).event_loop == "uvloop"
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    assert load_section(None, _overrides(parser.parse_args(["admission", "proxy", "--no-uvloop"]))).event_loop == "asyncio"
    with pytest.raises(ConfigError, match="event_loop"):
        load_section(None, {"event_loop": "trio"})
    assert loop_factory("asyncio") is None
    factory = loop_factory("uvloop")
    assert factory is not None
    loop = factory()
    try:
        assert type(loop).__module__.startswith("uvloop") and isinstance(loop, asyncio.AbstractEventLoop)
    finally:
        loop.close()


def test_without_uvloop_installed_the_proxy_falls_back_to_asyncio(monkeypatch, caplog):
    import sys

    from controllers.admission.cli import loop_factory

    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    with caplog.at_level("WARNING", logger="promreflex.admission"):
        assert loop_factory("uvloop") is None
    assert "uvloop is not installed" in caplog.text
