"""The capability mechanism: manifests discovered through entry points, and a throwaway
capability (tests/throwaway_capability.py) that gets its config section, subcommand, process,
scrape job, routes and inhibit rule into the local stack and the compose files with no change
in ``promreflex/``."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator
from pydantic import BaseModel

from promreflex import capability
from promreflex.capability import Capability, CapabilityError, Process, Scrape, discover
from promreflex.cli import main
from promreflex.compose import compose_files
from promreflex.config import DEFAULT_CONFIG, REPO_ROOT, ConfigError, load_config, ports_model
from promreflex.stack import Stack
from tests import throwaway_capability

SCHEMA = REPO_ROOT / "tests" / "fixtures" / "compose-spec.json"


@pytest.fixture
def demo(tmp_path: Path) -> Capability:
    return throwaway_capability.make(tmp_path / "demo.rules.yml")


def check(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------- discovery


def test_the_installed_capabilities_come_from_entry_points() -> None:
    names = [cap.name for cap in discover()]
    # The shipped set, pinned: a capability added (README "Add a capability") is added here.
    assert names == ["accesslog", "admission", "controller", "copy_guard", "fleet", "mesh", "nginx_tuner", "rca", "swift"]


def test_a_broken_entry_point_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from importlib.metadata import EntryPoint

    broken = EntryPoint("broken", "nowhere.at_all:CAPABILITY", capability.ENTRY_POINT_GROUP)
    monkeypatch.setattr(capability, "entry_points", lambda group: [broken])
    monkeypatch.setattr(capability, "_discovered", None)
    assert main(["config", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("promreflex: capability 'broken' (nowhere.at_all:CAPABILITY) cannot be loaded: "
                          "ModuleNotFoundError"), err


def test_a_command_line_that_cannot_be_registered_is_one_line_naming_its_capability(capsys) -> None:
    def clash(sub: argparse._SubParsersAction) -> None:
        sub.add_parser("config")  # the core's

    def broken(sub: argparse._SubParsersAction) -> None:
        raise ModuleNotFoundError("No module named 'no_such_module_xyz'")

    for cli, said in ((clash, "conflicting subparser: config"), (broken, "ModuleNotFoundError: No module named")):
        cap = Capability(name="newbie", summary="a newcomer's", cli=(cli,))
        assert main(["config", "list"], capabilities=[cap]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("promreflex: capability 'newbie': its command line"), err
        assert said in err, err


def test_a_manifest_whose_model_has_no_valid_default_or_a_job_on_no_port_is_refused() -> None:
    class Needs(BaseModel):
        file: str  # no default: a user who leaves the section out has no valid one

    cap = Capability(name="newbie", summary="a newcomer's", config_section="newbie", config_model=Needs)
    with pytest.raises(CapabilityError, match="capability 'newbie': Needs has no valid default for file"):
        load_config(None, capabilities=[cap])
    typo = Capability(name="newbie", summary="a newcomer's",
                      processes=(Process("newbie", lambda ctx: [], {"newbie_exporter": 21999}),),
                      scrape_jobs=(Scrape("newbie", "newbie_exportr"),))
    with pytest.raises(CapabilityError, match="scrape job 'newbie' names port 'newbie_exportr', which no process"):
        load_config(None, capabilities=[typo])


def test_clashing_manifests_are_refused(demo: Capability) -> None:
    twin = Capability(name="twin", summary="takes the demo's port",
                      processes=(Process("twin", lambda ctx: [], {"demo": 1}),))
    with pytest.raises(CapabilityError, match="port 'demo' is declared by both 'demo' and 'twin'"):
        load_config(None, capabilities=[demo, twin])
    with pytest.raises(CapabilityError, match="capability 'demo' is declared by both"):
        load_config(None, capabilities=[demo, demo])


# ---------------------------------------------------------------- configuration


def test_a_capability_section_is_validated_with_the_rest_naming_each_key(demo: Capability, tmp_path: Path) -> None:
    path = tmp_path / "c.yml"
    path.write_text("demo: {greeting: 'Hi there', repeat: 0, colour: red}\nstack: {ports: {demo: 70000}}\n"
                    "controller: {reconcile_interval: soon}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path, capabilities=[demo])
    text = "\n".join(exc.value.problems)
    for key in ("demo.greeting", "demo.repeat", "demo.colour", "stack.ports.demo", "controller.reconcile_interval"):
        assert key in text, text
    path.write_text("demo: {greeting: hi, repeat: 2}\n")
    cfg = load_config(path, capabilities=[demo])
    assert (cfg.demo.greeting, cfg.demo.repeat) == ("hi", 2)  # type: ignore[attr-defined]
    assert ports_model([demo])().demo == throwaway_capability.PORT  # type: ignore[attr-defined]
    # Without the capability, its section is an unknown key like any typo.
    with pytest.raises(ConfigError, match="demo: Extra inputs are not permitted"):
        load_config(path, capabilities=[])


def test_the_embedded_defaults_bring_each_manifests_routes(demo: Capability) -> None:
    names = [r.name for r in load_config(DEFAULT_CONFIG, capabilities=[demo]).controller.routes]
    assert names == ["selftest-log", "nginx-down-log", "demo-log"]
    installed = [r.name for r in load_config(DEFAULT_CONFIG).controller.routes]
    assert installed == ["selftest-log", "nginx-down-log", "copy-guard", "mesh-rca"]  # shipped: add a new one's
    assert load_config(None, capabilities=[demo]).controller.routes == []  # bare model defaults: none


# ---------------------------------------------------------------- the CLI


def test_a_capability_adds_its_subcommand(demo: Capability, tmp_path: Path, capsys) -> None:
    path = tmp_path / "c.yml"
    path.write_text("demo: {greeting: hi, repeat: 3}\n")
    assert main(["demo-hello", "--config.file", str(path)], capabilities=[demo]) == 0
    assert capsys.readouterr().out == "hi hi hi\n"
    with pytest.raises(SystemExit):
        main(["demo-hello"], capabilities=[])


def test_every_flag_of_every_subcommand_has_help() -> None:
    from promreflex.cli import build_parser

    missing, seen = [], []

    def walk(parser: Any, path: str) -> None:
        seen.append(path)
        for action in parser._actions:
            if action.option_strings and action.help is None:
                missing.append(f"{path} {action.option_strings[0]}")
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")

    walk(build_parser(), "promreflex")
    assert {"promreflex rca explain", "promreflex stack up", "promreflex controller"} <= set(seen)
    # copy, copy-guard and exporter-accesslog: their owners are adding the missing help texts.
    for command in ("controller", "check-config", "stack up", "selftest", "compose build", "config snippets",
                    "tune-nginx", "exporter-nginx-memory", "calibrate", "rca", "exporter-mesh"):
        assert not [m for m in missing if m.startswith(f"promreflex {command} ")], missing


def test_controller_help_describes_the_controllers_own_flags(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["controller", "--help"])
    text = capsys.readouterr().out
    assert "local stack" not in text and "--state.dir" not in text
    assert "/webhook" in text and "--web.listen-address" in text and "controller.listen_address" in text


def test_a_user_error_is_one_line_and_exit_1(tmp_path: Path, capsys) -> None:
    token = tmp_path / "missing-token"
    cfg = tmp_path / "c.yml"
    cfg.write_text(yaml.safe_dump({"controller": {"token_file": str(token), "routes": []}}))
    assert main(["check-config", "--config.file", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("promreflex: ") and err.count("\n") == 1 and str(token) in err, err
    cfg.write_text("controller: {reconcile_interval: soon}\n")
    assert main(["check-config", "--config.file", str(cfg)]) == 2  # a configuration error keeps exit 2


# ---------------------------------------------------------------- the local stack


def test_the_local_stack_is_built_from_the_throwaway_capability(demo: Capability, tmp_path: Path) -> None:
    cfg = load_config(None, {"stack.state_dir": str(tmp_path / "state"), "demo.greeting": "hi"}, capabilities=[demo])
    stack = Stack(cfg, capabilities=[demo])
    components = {c.name: c for c in stack.components()}
    assert list(components) == ["prometheus", "alertmanager", "node_exporter", "nginx", "nginx_exporter",
                                "demo_server", "controller"]  # start order: the manifests' `order`
    server = components["demo_server"]
    assert server.port == throwaway_capability.PORT
    assert server.ready_url == f"http://127.0.0.1:{throwaway_capability.PORT}/metrics"
    assert server.argv[1:4] == ["-m", "http.server", str(throwaway_capability.PORT)]

    prom = stack.prometheus_config()
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert "accesslog" not in jobs  # only what the given capabilities declare
    assert jobs["demo"]["static_configs"] == [{"targets": [f"127.0.0.1:{throwaway_capability.PORT}"]}]
    assert jobs["demo"]["scrape_interval"] == "200ms"
    assert str(demo.rules[0]) in prom["rule_files"]

    am = stack.alertmanager_config()
    assert {"receiver": "promreflex", "matchers": ['alertname="DemoAlert"'], "repeat_interval": "5m"} in am["route"]["routes"]
    assert am["inhibit_rules"][-1]["source_matchers"] == ['alertname="DemoDown"']
    assert all("MeshRootCause" not in json.dumps(r) for r in am["inhibit_rules"])

    stack.render()
    assert (stack.dir / "demo-www" / "metrics").read_text().endswith('demo_greeting_info{greeting="hi"} 1\n')
    promtool = check(["promtool", "check", "config", str(stack.dir / "prometheus" / "prometheus.yml")])
    assert promtool.returncode == 0, promtool.stdout + promtool.stderr
    assert "demo.rules.yml" in promtool.stdout
    amtool = check(["amtool", "check-config", str(stack.dir / "alertmanager" / "alertmanager.yml")])
    assert amtool.returncode == 0, amtool.stdout + amtool.stderr


def test_a_rules_file_prometheus_would_refuse_refuses_stack_up_and_reload(tmp_path: Path, monkeypatch) -> None:
    """Prometheus refuses a whole reload for one bad rules file and keeps its old rules: `stack
    reload` said "reloaded prometheus", exit 0, and had already reloaded Alertmanager and the
    controller; `stack up` showed Prometheus' log without naming the file."""
    from promreflex.stack import StackError

    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "good.rules.yml").write_text((REPO_ROOT / "rules" / "accesslog.rules.yml").read_text())
    (rules / "newbie.rules.yml").write_text("groups:\n- name: x\n  rules:\n  - alert: A\n    expr: foo > \n")
    cfg = load_config(None, {"stack.state_dir": str(tmp_path / "state"), "stack.rules_dir": str(rules)},
                      capabilities=[])
    stack = Stack(cfg, capabilities=[])
    assert [p for p in stack.rules_problems() if "newbie.rules.yml" in p and "parse error" in p]
    assert not [p for p in stack.rules_problems() if "good.rules.yml" in p]
    with pytest.raises(StackError, match="(?s)Prometheus would refuse these rules, nothing started.*newbie.rules.yml"):
        stack.preflight()
    monkeypatch.setattr(Stack, "running", lambda self: {"prometheus": 1, "controller": 2})
    monkeypatch.setattr(Stack, "_recorded", lambda self: {})
    signalled: list[int] = []
    monkeypatch.setattr("os.kill", lambda pid, sig: signalled.append(pid))
    with pytest.raises(StackError, match="(?s)the configuration is refused, nothing reloaded.*newbie.rules.yml"):
        stack.reload(progress=lambda line: None)
    assert signalled == [] and not (tmp_path / "state" / "prometheus").exists()  # nothing signalled or rendered
    (rules / "newbie.rules.yml").rename(rules / ".#newbie.rules.yml")  # an editor's lock file: Prometheus loads it
    assert [p for p in stack.rules_problems() if ".#newbie.rules.yml" in p]
    monkeypatch.setattr(Stack, "_recorded", lambda self: {"prometheus": {"pid": 1}})
    stopped: list[str] = []
    monkeypatch.setattr(Stack, "stop_component", lambda self, name: stopped.append(name))
    with pytest.raises(StackError, match="(?s)Prometheus would refuse these rules, nothing restarted"):
        stack.restart(["prometheus"], progress=lambda line: None)
    assert stopped == []  # the healthy Prometheus was not stopped
    (rules / ".#newbie.rules.yml").unlink()
    assert stack.rules_problems() == []


# ---------------------------------------------------------------- compose


def test_the_compose_files_are_built_from_the_throwaway_capability(demo: Capability, tmp_path: Path) -> None:
    files = compose_files(capabilities=[demo])
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "prometheus" / "rules").symlink_to(REPO_ROOT / "rules")

    compose = yaml.safe_load(files["docker-compose.yml"].replace("${", "").replace("}", ""))
    errors = list(Draft7Validator(json.loads(SCHEMA.read_text())).iter_errors(compose))
    assert errors == []
    assert "demo-server" in compose["services"] and "accesslog-exporter" not in compose["services"]
    assert compose["services"]["demo-server"]["command"][:3] == ["python", "-m", "http.server"]
    assert "  # the throwaway capability\n  demo-server:\n" in files["docker-compose.yml"]
    # its rendered file is mounted where its command line reads it; the foundation's own
    # volumes bring theirs (nginx.conf at /etc/nginx), nothing added to them
    assert compose["services"]["demo-server"]["volumes"] == [
        "./demo-www/metrics:/var/lib/promreflex/demo-www/metrics:ro"]
    assert "/var/lib/promreflex/nginx" not in json.dumps(compose["services"]["nginx"])

    prom = yaml.safe_load(files["prometheus/prometheus.yml"])
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["demo"]["static_configs"] == [{"targets": [f"demo-server:{throwaway_capability.PORT}"]}]
    result = check(["promtool", "check", "config", str(tmp_path / "prometheus" / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr

    am = yaml.safe_load(files["alertmanager/alertmanager.yml"])
    assert am["inhibit_rules"][-1]["target_matchers"] == ['alertname="DemoAlert"']
    result = check(["amtool", "check-config", str(tmp_path / "alertmanager" / "alertmanager.yml")])
    assert result.returncode == 0, result.stdout + result.stderr

    routes = load_config(tmp_path / "promreflex" / "promreflex.yml", capabilities=[demo]).controller.routes
    assert [r.name for r in routes] == ["selftest-log", "nginx-down-log", "demo-log"]


# ---------------------------------------------------------------- manifests and the repository


def test_every_rules_file_and_dashboard_belongs_to_exactly_one_manifest() -> None:
    from promreflex.config import all_capabilities

    owners: dict[str, list[str]] = {}
    for cap in all_capabilities():
        for name in [*map(str, cap.rules), *cap.dashboards]:
            owners.setdefault(name, []).append(cap.name)
    files = [p.name for p in (REPO_ROOT / "rules").glob("*.yml")] + [p.name for p in (REPO_ROOT / "dashboards").glob("*.json")]
    assert sorted(owners) == sorted(files), "declare each rules file and dashboard in its capability's manifest"
    assert all(len(o) == 1 for o in owners.values()), owners


def test_snippets_give_a_user_a_working_prometheus_and_alertmanager(tmp_path: Path, capsys) -> None:
    assert main(["config", "snippets", "foundation", "accesslog", "copy_guard", "--host", "10.0.0.5",
                 "--token-file", "/etc/promreflex/token"]) == 0
    text = capsys.readouterr().out
    docs = [yaml.safe_load(part.split("\n", 1)[1]) for part in text.split("\n\n# ")[1:]]
    merged: dict[str, Any] = {}
    for doc in docs:
        merged.update(doc)
    assert "10.0.0.5:9181" in json.dumps(merged["scrape_configs"])
    (webhook,) = merged["receivers"][0]["webhook_configs"]
    assert webhook["url"] == "http://10.0.0.5:9095/webhook" and webhook["send_resolved"] is True
    assert webhook["http_config"]["authorization"]["credentials_file"] == "/etc/promreflex/token"
    assert [r["name"] for r in merged["controller"]["routes"]] == ["selftest-log", "nginx-down-log", "copy-guard"]

    prom = tmp_path / "prometheus.yml"
    prom.write_text(yaml.safe_dump({"rule_files": merged["rule_files"], "scrape_configs": merged["scrape_configs"]}))
    result = check(["promtool", "check", "config", str(prom)])
    assert result.returncode == 0 and "copy-guard.rules.yml" in result.stdout, result.stdout + result.stderr
    am = tmp_path / "alertmanager.yml"
    am.write_text(yaml.safe_dump({"route": {"receiver": "mine", "routes": merged["routes"]},
                                  "receivers": [{"name": "mine"}, *merged["receivers"]],
                                  "inhibit_rules": merged["inhibit_rules"]}))
    result = check(["amtool", "check-config", str(am)])
    assert result.returncode == 0, result.stdout + result.stderr
    ctl = tmp_path / "promreflex.yml"
    ctl.write_text(yaml.safe_dump({"controller": merged["controller"]}))
    assert [r.name for r in load_config(ctl).controller.routes] == ["selftest-log", "nginx-down-log", "copy-guard"]


def test_the_admission_snippet_scrapes_the_proxy_as_its_rules_select_it(tmp_path: Path, capsys) -> None:
    """The proxy runs in front of the user's app, not in the stack: its scrape job was in no
    snippet, so its rules and dashboard got no data (a stranger's review, Q F7)."""
    assert main(["config", "snippets", "admission", "--host", "10.0.0.5"]) == 0
    text = capsys.readouterr().out
    jobs = next(yaml.safe_load(part.split("\n", 1)[1])["scrape_configs"] for part in text.split("\n\n# ")[1:]
                if "scrape_configs" in part)
    assert [j["job_name"] for j in jobs] == ["admission"]
    rules = (REPO_ROOT / "rules" / "admission.rules.yml").read_text()
    # on --host like every other job (a review: it stayed on 127.0.0.1)
    assert "job `admission`" in rules and jobs[0]["static_configs"][0]["targets"] == ["10.0.0.5:9188"]
    prom = tmp_path / "prometheus.yml"
    prom.write_text(yaml.safe_dump({"scrape_configs": jobs}))
    result = check(["promtool", "check", "config", str(prom)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_config_warns_of_a_copy_guard_route_that_no_copy_guard_alert_reaches(tmp_path: Path, capsys) -> None:
    """A stranger's typo (review R3): `alertname=~"CopyGuardSiteOverload|CopyGuardSiteCrowd"` is
    anchored and matches none of the real names; check-config and the doctor said OK, and the
    controller took the webhooks and did nothing."""
    from controllers.copy_guard import doctor

    cfg = tmp_path / "promreflex.yml"
    for matchers, warned in (([r'alertname=~"CopyGuardSiteOverload|CopyGuardSiteCrowd"'], True),
                             ([r'alertname=~"CopyGuardSite.*"', 'site="shop"'], False),
                             # two names cut short: only one of three gets through (a review of the fix)
                             ([r'alertname=~"CopyGuardSiteOverloaded|CopyGuardSiteOverloadPredict|CopyGuardSiteCrowd"'],
                              True)):
        cfg.write_text(yaml.safe_dump({"controller": {"routes": [
            {"name": "copy-guard", "matchers": matchers, "action": "copy-guard"}]}}))
        assert main(["check-config", "--config.file", str(cfg)]) == 0
        err = capsys.readouterr().err
        assert ("route 'copy-guard' runs copy-guard but its matchers" in err) is warned, err
        assert ("not CopyGuardSiteOverloadPredicted, CopyGuardSiteCrowded through" in err) is (
            warned and "Predict|" in matchers[0]), err
        assert bool(doctor._route_warnings(load_config(cfg).controller)) is warned
