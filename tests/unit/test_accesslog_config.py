"""Access-log exporter configuration (YAML and flags) and its CLI wiring."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from exporters.accesslog.cli import COMMAND, add_arguments, cmd_exporter_accesslog, config_from_args, parse_log_flag, register
from exporters.accesslog.config import DEFAULT_BUCKETS, AccessLogConfig, load_accesslog_config
from promreflex.config import ConfigError

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "accesslog"


def test_valid_example_loads() -> None:
    cfg = load_accesslog_config(FIXTURES / "shop.yml")
    assert [s.site for s in cfg.logs] == ["shop", "api"]
    assert cfg.poll_interval == 0.2
    assert cfg.has_routes
    assert [r.name for r in cfg.logs[0].routes] == ["checkout", "product", "search"]
    assert cfg.duration_buckets == DEFAULT_BUCKETS
    assert cfg.from_start is False


def test_invalid_example_reports_every_problem_naming_its_key() -> None:
    with pytest.raises(ConfigError) as exc:
        load_accesslog_config(FIXTURES / "invalid.yml")
    problems = exc.value.problems
    keys = sorted(p.split(":", 1)[0] for p in problems)
    assert keys == sorted([
        "listen_address", "poll_interval", "logs[0].site", "logs[0].format", "logs[1]",
        "logs[2].routes[0]", "logs[2].routes[1].regex", "logs[3]", "logs[4].colour",
    ])
    text = "\n".join(problems)
    assert "needs log_format" in text and "no $status" in text and "exactly one of prefix or regex" in text


@pytest.mark.parametrize(
    ("content", "message"),
    [("logs: [", "not valid YAML"), ("- a\n- b\n", "top level must be a mapping"), ("{}", "logs: Field required")],
)
def test_unusable_files(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "c.yml"
    f.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_accesslog_config(f)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_accesslog_config("/nonexistent/accesslog.yml")


def test_model_rules() -> None:
    base = {"site": "a", "path": "/x.log"}
    with pytest.raises(ValueError, match="each log path may appear once"):
        AccessLogConfig.model_validate({"logs": [base, {**base, "site": "b"}]})
    with pytest.raises(ValueError, match="only read with format 'custom'"):
        AccessLogConfig.model_validate({"logs": [{**base, "log_format": "$status"}]})
    with pytest.raises(ValueError, match="routes need a path"):
        AccessLogConfig.model_validate({"logs": [{**base, "format": "custom", "log_format": "$status $request_time",
                                                  "routes": [{"name": "x", "prefix": "/"}]}]})
    with pytest.raises(ValueError, match="route names must be unique"):
        AccessLogConfig.model_validate({"logs": [{**base, "routes": [{"name": "x", "prefix": "/a"},
                                                                      {"name": "x", "prefix": "/b"}]}]})
    with pytest.raises(ValueError, match="strictly increasing"):
        AccessLogConfig.model_validate({"logs": [base], "duration_buckets": [1, 0.5]})
    with pytest.raises(ValueError, match="at most 50"):
        AccessLogConfig.model_validate({"logs": [{**base, "routes": [{"name": f"r{i}", "prefix": f"/{i}"} for i in range(51)]}]})


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("shop=/var/log/nginx/access.log", {"site": "shop", "path": "/var/log/nginx/access.log"}),
        ("shop=/var/log/a.log:nginx_timed", {"site": "shop", "path": "/var/log/a.log", "format": "nginx_timed"}),
        ("shop=/odd:name.log", {"site": "shop", "path": "/odd:name.log"}),
    ],
)
def test_log_flag(flag: str, expected: dict) -> None:
    assert parse_log_flag(flag) == expected


def test_log_flag_rejects_garbage() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_log_flag("no-equals-sign")


def test_an_empty_format_after_the_colon_is_named(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="empty FORMAT after ':'"):
        parse_log_flag(f"shop={tmp_path}/access.log:")
    odd = tmp_path / "odd.log:"  # a file whose name really ends in ':' is taken as it is
    odd.write_text("")
    assert parse_log_flag(f"shop={odd}") == {"site": "shop", "path": str(odd)}


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_flags_build_a_config(tmp_path: Path) -> None:
    cfg = config_from_args(_args(["--log", "a=/x.log:apache_combined", "--log", "b=/y.log",
                                  "--web.listen-address", "127.0.0.1:9999", "--state.dir", str(tmp_path),
                                  "--log.from-start"]))
    assert [(s.site, s.format) for s in cfg.logs] == [("a", "apache_combined"), ("b", "nginx_combined")]
    assert cfg.listen_address == "127.0.0.1:9999" and cfg.state_dir == tmp_path and cfg.from_start


def test_flags_override_file() -> None:
    cfg = config_from_args(_args(["--config.file", str(FIXTURES / "shop.yml"), "--web.listen-address", "127.0.0.1:1"]))
    assert cfg.listen_address == "127.0.0.1:1" and len(cfg.logs) == 2 and cfg.from_start is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no log to follow"),
        (["--config.file", "x.yml", "--log", "a=/x"], "not both"),
        (["--log", "bad site=/x"], "logs[0].site"),
        (["--log", "a=/x", "--web.listen-address", "nope"], "listen_address"),
    ],
)
def test_bad_flags_are_config_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_args(_args(argv))
    assert message in str(exc.value)


def test_register_adds_subcommand_with_handler() -> None:
    parser = argparse.ArgumentParser(prog="promreflex")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args([COMMAND, "--log", "shop=/var/log/a.log", "--log.level", "debug"])
    assert args.func is cmd_exporter_accesslog
    assert args.logs == [{"site": "shop", "path": "/var/log/a.log"}] and args.log_level == "debug"


def test_shipped_example_loads() -> None:
    cfg = load_accesslog_config(Path(__file__).resolve().parents[2] / "exporters" / "accesslog" / "example.yml")
    assert [(s.site, s.format) for s in cfg.logs] == [("shop", "nginx_timed"), ("api", "custom")]
    assert [r.name for r in cfg.logs[0].routes] == ["checkout", "cart", "product", "search"]
