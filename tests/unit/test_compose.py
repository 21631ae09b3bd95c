"""The compose stack, checked without a Docker engine.

The files are generated from the manifests (``python -m promreflex compose build``); the first
tests check the committed ones are exactly what the manifests give. No container can run on
this machine, so the compose file is validated against the Compose
Specification JSON schema (after interpolating ``.env`` the way ``docker compose`` does), each
tool's configuration is checked by that tool's own checker (promtool, amtool, nginx -t, the
controller's loader), and the wiring between services (targets, secrets, mounts, flags) is
compared with what the other side expects.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator

from promreflex.compose import build
from promreflex.config import DEFAULT_CONFIG, REPO_ROOT, load_config, split_host_port

COMPOSE_DIR = REPO_ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
ENV_FILE = COMPOSE_DIR / ".env"
SCHEMA_FILE = REPO_ROOT / "tests" / "fixtures" / "compose-spec.json"

#: Scrape jobs of the local stack; compose uses the same names so rules and dashboards fit both.
JOBS = {"prometheus", "alertmanager", "node", "selftest", "nginx", "accesslog", "promreflex-controller"}

#: Local binary of the same version as each service's image: its --help lists the valid flags.
SERVICE_BINARIES = {
    "prometheus": "prometheus",
    "alertmanager": "prometheus-alertmanager",
    "node-exporter": "prometheus-node-exporter",
    "nginx-exporter": "prometheus-nginx-exporter",
}

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def read_env(path: Path = ENV_FILE) -> dict[str, str]:
    """KEY=VALUE lines of a compose ``.env`` file; blank lines and ``#`` comments skipped."""
    env: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f"{path}:{number}: not KEY=VALUE: {line}"
        env[key] = value
    return env


def interpolate(text: str, env: dict[str, str]) -> str:
    """Replace ``${VAR}`` from ``env``. Any other ``$`` form, or an undefined variable, fails:
    the compose file uses only ``${VAR}``, so a typo cannot silently become an empty string."""
    missing = sorted({m.group(1) for m in _VAR.finditer(text)} - env.keys())
    assert not missing, f"variables used in {COMPOSE_FILE.name} but not defined in .env: {missing}"
    out = _VAR.sub(lambda m: env[m.group(1)], text)
    assert "$" not in out, f"unsupported $ syntax left after interpolation: {out[out.index('$'):][:40]!r}"
    return out


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return read_env()


@pytest.fixture(scope="module")
def compose(env: dict[str, str]) -> dict[str, Any]:
    return yaml.safe_load(interpolate(COMPOSE_FILE.read_text(), env))


@pytest.fixture(scope="module")
def prometheus_config() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())


@pytest.fixture(scope="module")
def alertmanager_config() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE_DIR / "alertmanager" / "alertmanager.yml").read_text())


def schema_errors(document: dict[str, Any]) -> list[str]:
    validator = Draft7Validator(json.loads(SCHEMA_FILE.read_text()))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(source, target, mode) of a service's short-syntax bind mounts (source starts . or /)."""
    mounts = []
    for volume in service.get("volumes", []):
        assert isinstance(volume, str), f"use the short volume syntax: {volume}"
        source, target, *mode = volume.split(":")
        if source.startswith((".", "/")):
            mounts.append((source, target, mode[0] if mode else "rw"))
    return mounts


def mount_target(service: dict[str, Any], target: str) -> Path:
    """The repository path a service mounts at ``target``."""
    for source, tgt, _ in bind_mounts(service):
        if tgt == target:
            return (COMPOSE_DIR / source).resolve()
    raise AssertionError(f"nothing mounted at {target}")


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed")
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)


# ---------------------------------------------------------------- generated from the manifests


def test_committed_compose_files_are_what_the_manifests_generate() -> None:
    said: list[str] = []
    assert build(check=True, out=said.append) == 0, "\n".join(said) + "\nrun: python -m promreflex compose build"


def test_drift_check_names_a_hand_edited_file_and_build_repairs_it(tmp_path: Path) -> None:
    assert build(tmp_path, out=lambda *_: None) == 0
    prom = tmp_path / "prometheus" / "prometheus.yml"
    prom.write_text(prom.read_text().replace("job_name: accesslog", "job_name: access-log"))
    said: list[str] = []
    assert build(tmp_path, check=True, out=said.append) == 1
    report = "\n".join(said)
    assert f"{prom} (committed)" in report and "-- job_name: access-log" in report.replace("\n-", "\n--"), report
    assert "1 compose file(s) differ" in report
    assert build(tmp_path, out=lambda *_: None) == 0 and build(tmp_path, check=True, out=lambda *_: None) == 0


def test_compose_build_check_from_the_command_line() -> None:
    result = run([sys.executable, "-m", "promreflex", "compose", "build", "--check"])
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- the compose file itself


def test_interpolation_rejects_undefined_variables() -> None:
    with pytest.raises(AssertionError, match="NOT_DEFINED"):
        interpolate("image: ${NOT_DEFINED}", {"OTHER": "x"})
    assert interpolate("image: ${A}:${B}", {"A": "prom/prometheus", "B": "v2.42.0"}) == "image: prom/prometheus:v2.42.0"


def test_every_env_variable_is_used() -> None:
    used = set(_VAR.findall(COMPOSE_FILE.read_text()))
    assert set(read_env()) == used, "an unused .env entry is a pin nobody reads"


def test_compose_file_validates_against_the_compose_specification(compose: dict[str, Any]) -> None:
    assert schema_errors(compose) == []
    assert set(compose["services"]) == {
        "prometheus", "alertmanager", "node-exporter", "nginx", "nginx-exporter", "accesslog-exporter", "promreflex", "grafana"
    }


def test_schema_catches_a_broken_compose_file(compose: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(compose))
    broken["services"]["prometheus"]["ports"] = "127.0.0.1:9090:9090"  # must be a list
    broken["services"]["nginx"]["restart_policy"] = "always"  # no such key
    errors = schema_errors(broken)
    assert any(e.startswith("services/prometheus/ports") for e in errors), errors
    assert any("restart_policy" in e for e in errors), errors


def test_image_tags_are_pinned_in_env_only(compose: dict[str, Any], env: dict[str, str]) -> None:
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    for name, service in raw["services"].items():
        assert re.fullmatch(r"\$\{[A-Z_]+_IMAGE\}", service["image"]), f"{name}: image must come from .env"
    images = {name: s["image"] for name, s in compose["services"].items()}
    images["promreflex (base)"] = compose["services"]["promreflex"]["build"]["args"]["PYTHON_IMAGE"]
    for name, image in images.items():
        repository, sep, tag = image.rpartition(":")
        assert sep and "/" not in tag and repository, f"{name}: {image} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{name}: {image} is not pinned to a version"
    dockerfile = (COMPOSE_DIR / "promreflex" / "Dockerfile").read_text()
    from_lines = [line for line in dockerfile.splitlines() if line.startswith("FROM ")]
    assert from_lines == ["FROM ${PYTHON_IMAGE}"], "the base image tag belongs in .env, not the Dockerfile"
    assert re.search(r"^ARG PYTHON_IMAGE$", dockerfile, re.M)


def test_image_versions_match_the_tested_debian_versions(env: dict[str, str]) -> None:
    assert env["PROMETHEUS_IMAGE"].endswith(":v2.42.0")
    assert env["ALERTMANAGER_IMAGE"].endswith(":v0.25.0")
    assert env["NODE_EXPORTER_IMAGE"].endswith(":v1.5.0")
    assert env["NGINX_EXPORTER_IMAGE"].endswith(":0.11.0")
    assert env["NGINX_IMAGE"].endswith(":1.22.1")
    assert env["GRAFANA_IMAGE"].startswith("grafana/grafana:10.1.")


def test_bind_mounts_exist_in_the_repository_and_are_read_only(compose: dict[str, Any]) -> None:
    seen = 0
    for name, service in compose["services"].items():
        for source, target, mode in bind_mounts(service):
            path = (COMPOSE_DIR / source).resolve()
            assert path.exists(), f"{name}: bind mount source {source} does not exist"
            assert path.is_relative_to(REPO_ROOT), f"{name}: {source} is outside the repository"
            assert mode == "ro", f"{name}: {source} -> {target} must be mounted read-only"
            seen += 1
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], f"{name}: named volume {source} is not declared"
    assert seen >= 8
    for secret in compose["secrets"].values():
        assert (COMPOSE_DIR / secret["file"]).is_file(), f"secret file {secret['file']} does not exist"


def test_published_ports_bind_loopback_only(compose: dict[str, Any]) -> None:
    published = {}
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), f"{name}: {port} is not loopback-only"
            published[name] = port
    assert published == {
        "prometheus": "127.0.0.1:9090:9090",
        "alertmanager": "127.0.0.1:9093:9093",
        "nginx": "127.0.0.1:8080:80",
        "promreflex": "127.0.0.1:9095:9095",
        "grafana": "127.0.0.1:3000:3000",
    }


def test_service_flags_exist_in_the_tested_binaries(compose: dict[str, Any]) -> None:
    for service, binary in SERVICE_BINARIES.items():
        result = run([binary, "--help"])
        usage = result.stdout + result.stderr
        flags = [arg.split("=")[0] for arg in compose["services"][service]["command"] if arg.startswith("-")]
        assert flags, f"{service} has no flags to check"
        for flag in flags:
            # kingpin lists --flag (a boolean's --no-flag as --flag), Go's flag package lists -flag
            # (nginx exporter 0.11).
            listed = "--" + flag.removeprefix("--no-") if flag.startswith("--no-") else flag
            assert re.search(rf"(^|\s){re.escape(listed)}[\s=]", usage), f"{service}: {binary} does not know {flag}"


# ---------------------------------------------------------------- Prometheus


def test_promtool_accepts_the_prometheus_config_and_its_rule_files() -> None:
    rules = sorted((REPO_ROOT / "rules").glob("*.yml"))
    result = run(["promtool", "check", "config", "compose/prometheus/prometheus.yml"])
    assert result.returncode == 0, result.stdout + result.stderr
    # Through the symlink compose/prometheus/rules -> ../../rules, the repository's own files.
    assert (COMPOSE_DIR / "prometheus" / "rules").resolve() == REPO_ROOT / "rules"
    if rules:
        assert f"SUCCESS: {len(rules)} rule files found" in result.stdout, result.stdout


def test_rules_are_mounted_where_rule_files_points(compose: dict[str, Any], prometheus_config: dict[str, Any]) -> None:
    (pattern,) = prometheus_config["rule_files"]
    target = "/etc/prometheus/" + str(Path(pattern).parent)
    assert mount_target(compose["services"]["prometheus"], target) == REPO_ROOT / "rules"


def test_scrape_jobs_reach_compose_services(compose: dict[str, Any], prometheus_config: dict[str, Any]) -> None:
    jobs = {job["job_name"]: job for job in prometheus_config["scrape_configs"]}
    assert set(jobs) == JOBS
    for name, job in jobs.items():
        for static in job["static_configs"]:
            for target in static["targets"]:
                host, _ = split_host_port(target)
                assert host in compose["services"], f"job {name}: {target} is not a compose service"
    assert jobs["selftest"]["params"] == {"collect[]": ["textfile"]}
    assert jobs["selftest"]["static_configs"] == jobs["node"]["static_configs"]
    (am,) = prometheus_config["alerting"]["alertmanagers"]
    assert am["static_configs"] == [{"targets": ["alertmanager:9093"]}]


def test_intervals_match_the_local_stack(prometheus_config: dict[str, Any]) -> None:
    from promreflex.stack import Stack

    local = Stack(load_config(DEFAULT_CONFIG)).prometheus_config()
    interval = {j["job_name"]: j.get("scrape_interval", prometheus_config["global"]["scrape_interval"])
                for j in prometheus_config["scrape_configs"]}
    assert interval == {j["job_name"]: j["scrape_interval"] for j in local["scrape_configs"]}
    assert prometheus_config["global"]["evaluation_interval"] == local["global"]["evaluation_interval"] == "200ms"


def test_prometheus_resends_alerts_fast(compose: dict[str, Any]) -> None:
    assert "--rules.alert.resend-delay=1s" in compose["services"]["prometheus"]["command"]


# ---------------------------------------------------------------- Alertmanager and the controller


def test_amtool_accepts_the_alertmanager_config() -> None:
    result = run(["amtool", "check-config", "compose/alertmanager/alertmanager.yml"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_alertmanager_routing_matches_the_local_stack(alertmanager_config: dict[str, Any]) -> None:
    from promreflex.stack import Stack

    local = Stack(load_config(DEFAULT_CONFIG)).alertmanager_config()
    route = alertmanager_config["route"]
    for key in ("receiver", "group_by", "group_wait", "group_interval", "repeat_interval"):
        assert route[key] == local["route"][key], key
    assert alertmanager_config["inhibit_rules"] == local["inhibit_rules"]
    assert [r["receiver"] for r in route["routes"]] == ["promreflex"]  # Watchdog heartbeat: same receiver


def test_webhook_token_and_url_wiring(compose: dict[str, Any], alertmanager_config: dict[str, Any]) -> None:
    (secret_name,) = compose["secrets"]
    secret_path = f"/run/secrets/{secret_name}"
    for service in ("alertmanager", "promreflex"):
        assert compose["services"][service]["secrets"] == [secret_name]
    (receiver,) = alertmanager_config["receivers"]
    (webhook,) = receiver["webhook_configs"]
    assert webhook["send_resolved"] is True
    assert webhook["http_config"]["authorization"] == {"type": "Bearer", "credentials_file": secret_path}

    controller = load_config(COMPOSE_DIR / "promreflex" / "promreflex.yml").controller
    # The controller refuses a token others can read; compose mounts the secret with its host
    # mode, so the controller's entrypoint copies it to a 0600 file of its own and reads that.
    (script,) = compose["services"]["promreflex"]["command"]
    assert compose["services"]["promreflex"]["entrypoint"] == ["/bin/sh", "-c"]
    assert script.startswith(f"install -m 0600 {secret_path} {controller.token_file} && exec promreflex controller ")
    host, port = split_host_port(controller.listen_address)
    assert host == "0.0.0.0"
    assert webhook["url"] == f"http://promreflex:{port}/webhook"
    for url in (controller.alertmanager_url, controller.prometheus_url):
        assert split_host_port(url.removeprefix("http://"))[0] in compose["services"]


def test_controller_routes_match_the_local_stack_defaults() -> None:
    compose_routes = load_config(COMPOSE_DIR / "promreflex" / "promreflex.yml").controller.routes
    assert compose_routes == load_config(DEFAULT_CONFIG).controller.routes


def test_controller_image_runs_the_controller_with_the_mounted_config(compose: dict[str, Any]) -> None:
    service = compose["services"]["promreflex"]
    assert service["build"]["context"] == ".."
    assert (COMPOSE_DIR / service["build"]["context"] / service["build"]["dockerfile"]).resolve() == (
        COMPOSE_DIR / "promreflex" / "Dockerfile"
    )
    config = next(arg.split("=", 1)[1] for arg in service["command"][0].split() if arg.startswith("--config.file="))
    assert mount_target(service, config) == COMPOSE_DIR / "promreflex" / "promreflex.yml"


# ---------------------------------------------------------------- nginx and Grafana


def test_nginx_config_is_valid(tmp_path: Path) -> None:
    # The access log lives on a compose volume; point it into a temporary folder for the check.
    conf = (COMPOSE_DIR / "nginx" / "nginx.conf").read_text()
    assert "/var/log/nginx/shop/access.log" in conf
    (tmp_path / "nginx.conf").write_text(conf.replace("/var/log/nginx/shop/access.log", str(tmp_path / "access.log")))
    result = run(["nginx", "-t", "-c", str(tmp_path / "nginx.conf"), "-e", "/dev/stderr"])
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


def test_nginx_logs_in_the_local_stack_format_and_serves_stub_status_to_the_exporter(compose: dict[str, Any]) -> None:
    import crossplane

    from promreflex.stack import NGINX_LOG_FORMAT

    parsed = crossplane.parse(str(COMPOSE_DIR / "nginx" / "nginx.conf"), single=True, check_ctx=False)
    http = next(d for d in parsed["config"][0]["parsed"] if d["directive"] == "http")["block"]
    log_format = next(d["args"] for d in http if d["directive"] == "log_format")
    assert log_format[0] == "promreflex" and "".join(log_format[1:]) == NGINX_LOG_FORMAT
    servers = [d["block"] for d in http if d["directive"] == "server"]
    stub = [s for s in servers if any(d["directive"] == "location" and d["args"] == ["=", "/stub_status"] for d in s)]
    (listen,) = [d["args"][0] for d in stub[0] if d["directive"] == "listen"]
    scrape_uri = next(a for a in compose["services"]["nginx-exporter"]["command"] if a.startswith("-nginx.scrape-uri="))
    assert scrape_uri == f"-nginx.scrape-uri=http://nginx:{listen}/stub_status"
    assert (COMPOSE_DIR / "nginx" / "html" / "index.html").is_file()


def test_grafana_provisions_the_repository_dashboards(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    provider_file = COMPOSE_DIR / "grafana" / "provisioning" / "dashboards" / "promreflex.yml"
    (provider,) = yaml.safe_load(provider_file.read_text())["providers"]
    assert provider["type"] == "file"
    assert mount_target(grafana, provider["options"]["path"]) == REPO_ROOT / "dashboards"
    assert mount_target(grafana, "/etc/grafana/provisioning") == COMPOSE_DIR / "grafana" / "provisioning"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (REPO_ROOT / "dashboards" / Path(home).relative_to(provider["options"]["path"])).is_file()


def test_grafana_datasource_is_the_compose_prometheus(compose: dict[str, Any]) -> None:
    path = COMPOSE_DIR / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
    (source,) = yaml.safe_load(path.read_text())["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == "http://prometheus:9090"
    assert "127.0.0.1:9090:9090" in compose["services"]["prometheus"]["ports"]


def test_the_heartbeat_route_repeats_every_minute_under_any_parent_route() -> None:
    # Alertmanager sends a repeat only on a group_interval tick: a route without its own inherits
    # the parent's (5m by default), and a stranger's cluster got the heartbeat every 5 minutes
    # (PromreflexWatchdogNotReceived pending in every cycle). What `config snippets` and the
    # README give must not depend on the user's parent route.
    from promreflex.foundation import FOUNDATION

    (route,) = [r for r in FOUNDATION.alertmanager_routes if 'alertname="Watchdog"' in r["matchers"]]
    seconds = {"0s": 0, "15s": 15, "30s": 30, "50s": 50, "1m": 60, "5m": 300}
    assert seconds[route["group_interval"]] <= seconds[route["repeat_interval"]] <= 60, route
    assert seconds[route["group_wait"]] <= 30
    readme = Path("README.md").read_text()
    block = readme[readme.index("matchers: ['alertname=\"Watchdog\"']"):][:300]
    assert "group_interval: 15s" in block and "repeat_interval: 50s" in block, block
