from pathlib import Path

import pytest

from promreflex.config import DEFAULT_CONFIG, ConfigError, format_duration, load_config, parse_duration

FIX = Path(__file__).parent.parent / "fixtures" / "config"


def test_valid_example_loads_with_every_value():
    cfg = load_config(FIX / "valid.yml")
    assert cfg.controller.listen_address == "0.0.0.0:9095"
    assert cfg.controller.reconcile_interval == 30.0
    route = cfg.controller.routes[0]
    assert route.cooldown == 60.0
    assert [str(m) for m in route.parsed_matchers()] == ['alertname="CopyGuardSiteOverloaded"', 'severity=~"warning|critical"']
    assert cfg.stack.ports.prometheus == 19090 and cfg.stack.ports.alertmanager == 9093
    assert cfg.stack.fast_interval == pytest.approx(0.2)
    assert cfg.accesslog.site == "web"  # a capability's own section


def test_invalid_example_reports_every_problem_naming_its_key():
    with pytest.raises(ConfigError) as exc:
        load_config(FIX / "invalid.yml")
    text = "\n".join(exc.value.problems)
    for key in (
        "controller.reconcile_interval",
        "controller.routes[0].name",
        "controller.routes[0].matchers",
        "controller.routes[0].colldown",
        "stack.host",
        "stack.ports.accesslog_exporter",
        "accesslog.site",
    ):
        assert key in text, f"{key} missing from:\n{text}"
    assert len(exc.value.problems) >= 7


def test_beyond_loopback_requires_a_token(tmp_path):
    cfg = tmp_path / "c.yml"
    cfg.write_text("controller: {listen_address: '0.0.0.0:9095'}\n")
    with pytest.raises(ConfigError, match="token_file"):
        load_config(cfg)
    cfg.write_text("controller: {listen_address: '127.0.0.2:9095'}\n")
    assert load_config(cfg).controller.token_file is None


def test_unknown_action_and_bad_params_are_reported_together(tmp_path):
    from controllers.engine import bind_routes

    cfg = tmp_path / "c.yml"
    cfg.write_text(
        "controller:\n  routes:\n"
        "    - {name: a, matchers: ['x=\"1\"'], action: nope}\n"
        "    - {name: b, matchers: ['x=\"1\"'], action: log, params: {mesage: hi}}\n"
    )
    with pytest.raises(ConfigError) as exc:
        bind_routes(load_config(cfg).controller)
    text = "\n".join(exc.value.problems)
    assert "routes[0].action: unknown action 'nope'" in text
    assert "routes[1].params.mesage" in text


@pytest.mark.parametrize("folder, mistake, said", [
    ("newbie_raises", 'raise RuntimeError("boom in action module")\n', "RuntimeError: boom in action module"),
])
def test_a_broken_action_module_is_left_out_and_named_the_others_run(tmp_path, monkeypatch, capsys, folder, mistake,
                                                                     said):
    """A newcomer's action.py that raises on import took the whole controller down (every
    capability's routes) with a traceback. (A name clash: the next test.)"""
    import controllers
    from controllers.actions.base import broken_actions, registry
    from controllers.engine import bind_routes
    from promreflex.cli import main

    pkg = tmp_path / folder  # (a name of its own: Python keeps an imported package)
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "action.py").write_text("from controllers.actions.base import Action, register\n\n" + mistake)
    monkeypatch.setattr(controllers, "__path__", [*controllers.__path__, str(tmp_path)])
    assert {"log", "copy-guard", "rca"} <= set(registry())
    assert said in broken_actions()[f"controllers/{folder}/action.py"]

    cfg = tmp_path / "c.yml"
    cfg.write_text("controller:\n  routes:\n    - {name: a, matchers: ['x=\"1\"'], action: log}\n")
    assert [b.action.name for b in bind_routes(load_config(cfg).controller)] == ["log"]
    assert main(["check-config", "--config.file", str(cfg)]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"warning: controllers/{folder}/action.py not loaded") and said in err, err

    cfg.write_text("controller:\n  routes:\n    - {name: a, matchers: ['x=\"1\"'], action: marker}\n")
    with pytest.raises(ConfigError) as exc:
        bind_routes(load_config(cfg).controller)
    assert "unknown action 'marker'" in exc.value.problems[0] and said in exc.value.problems[0]
    monkeypatch.undo()
    assert broken_actions() == {}


def test_a_clash_with_a_shipped_action_leaves_both_out_and_a_half_imported_module_says_why(tmp_path, monkeypatch):
    """A newcomer's module in a folder that sorts first, naming its action `copy-guard`, took the
    shipped copy guard's route (the shipped module was the one left out: check-config OK); a
    module that registered an action and then failed was reported as clashing with itself, and
    its half-imported action was bound."""
    import controllers
    from controllers.actions.base import broken_actions, registry
    from controllers.engine import bind_routes

    for folder, body in (
        ("aaa_canary", '@register\nclass Canary(Action):\n    name = "copy-guard"\n\n'
                       '    async def fire(self, ctx):\n        return ""\n'),
        ("aab_half", '@register\nclass Half(Action):\n    name = "half"\n\n'
                     '    async def fire(self, ctx):\n        return ""\n\n\nimport no_such_dependency_xyz  # noqa\n'),
    ):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
        (tmp_path / folder / "action.py").write_text("from controllers.actions.base import Action, register\n\n" + body)
    monkeypatch.setattr(controllers, "__path__", [*controllers.__path__, str(tmp_path)])
    for _ in range(2):  # the same answer when asked again (a failed module is imported anew)
        actions = registry()
        assert "copy-guard" not in actions and "half" not in actions and "log" in actions
        broken = broken_actions()
        assert "two actions are named 'copy-guard'" in broken["action 'copy-guard'"]
        assert broken["controllers/aab_half/action.py"] == "ModuleNotFoundError: No module named 'no_such_dependency_xyz'"
    with pytest.raises(ConfigError) as exc:
        bind_routes(load_config(DEFAULT_CONFIG).controller)  # the shipped copy-guard route: refused, saying why
    said = "\n".join(exc.value.problems)
    assert "unknown action 'copy-guard'" in said and "two actions are named 'copy-guard'" in said, said
    monkeypatch.undo()
    assert "copy-guard" in registry() and broken_actions() == {}


@pytest.mark.parametrize("text, seconds", [
    ("200ms", 0.2), ("15s", 15), ("1m", 60), (5, 5), ("1.5h", 5400), ("15 s", 15),
    # as Prometheus and Alertmanager write them (repeat_interval: 1h30m; a rule's for: 1m30s)
    ("1h30m", 5400), ("1m30s", 90), ("2d12h", 216000), ("1w", 604800), ("1s500ms", 1.5),
])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["soon", "-1s", True, "5 parsecs", "30m1h", "1h1h", "1h 30m", "nan", "1e3", "h", ""])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_format_duration_round_trips():
    for s in (0.2, 1, 15, 60, 120, 0.05):
        assert parse_duration(format_duration(s)) == pytest.approx(s)


def test_not_yaml_and_not_a_mapping(tmp_path):
    p = tmp_path / "c.yml"
    p.write_text("controller: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    p.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(p)


def test_a_file_without_routes_keeps_the_default_routes_and_an_empty_list_means_none(tmp_path: Path) -> None:
    from promreflex.config import default_routes

    ports_only = tmp_path / "ports.yml"
    ports_only.write_text("stack:\n  ports:\n    prometheus: 19090\n")
    names = [r.name for r in load_config(ports_only).controller.routes]
    assert names == [r["name"] for r in default_routes()] and "selftest-log" in names
    none = tmp_path / "none.yml"
    none.write_text("controller:\n  routes: []\n")
    assert load_config(none).controller.routes == []
    assert load_config(None).controller.routes == []


@pytest.mark.parametrize("text, key, first", [
    # a second controller: section pasted below the first (its routes and token were lost, the
    # default routes loaded, and check-config said OK)
    ("controller:\n  listen_address: 127.0.0.1:9095\ncontroller:\n  listen_address: 127.0.0.1:9096\n", "controller", 1),
    ("controller:\n  routes:\n    - name: a\n      matchers: ['x=\"1\"']\n      action: log\n      matchers: ['y=\"2\"']\n",
     "matchers", 4),
])
def test_a_key_given_twice_is_an_error_as_in_prometheus(tmp_path, capsys, text, key, first):
    from promreflex.cli import main

    path = tmp_path / "dup.yml"
    path.write_text(text)
    assert main(["check-config", "--config.file", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"key {key!r} is given twice in one mapping (first on line {first})" in err
    merged = tmp_path / "merge.yml"  # YAML merge keys, overridden: not duplicates (amtool takes them)
    merged.write_text(
        "controller:\n  alertmanager_url: null\n  routes:\n"
        "    - &base {name: a, matchers: ['alertname=\"A\"'], action: log}\n"
        "    - <<: *base\n      name: b\n      matchers: ['alertname=\"B\"']\n")
    assert main(["check-config", "--config.file", str(merged)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    one_line = tmp_path / "one.yml"  # a key twice on one line
    one_line.write_text("controller: {alertmanager_url: null, alertmanager_url: 'http://x:9093'}\n")
    assert main(["check-config", "--config.file", str(one_line)]) == 2
    assert "key 'alertmanager_url' is given twice" in capsys.readouterr().err


def test_matcher_items_as_alertmanager_takes_them(tmp_path):
    """Several matchers in one item and the {...} form (copied from an alertmanager.yml) were
    refused; commas inside a quoted value are the value's."""
    from promreflex.config import Route
    from promreflex.matchers import parse_matchers

    r = Route(name="r", action="log", matchers=['{alertname="X", site=~"a|b,c"}', 'severity!="info",'])
    got = [(m.name, m.op, m.value) for m in r.parsed_matchers()]
    assert got == [("alertname", "=", "X"), ("site", "=~", "a|b,c"), ("severity", "!=", "info")]
    assert all(m.matches({"alertname": "X", "site": "b,c", "severity": "page"}) for m in r.parsed_matchers())
    with pytest.raises(ValueError, match="holds no matcher"):
        parse_matchers("{}")
    with pytest.raises(ValueError, match="is not a matcher"):
        parse_matchers('a="x", oops')
