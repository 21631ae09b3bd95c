"""``stack.nginx.external``: the local stack guards an nginx that already runs (issue 16): it
starts no nginx, scrapes the given stub_status and follows the given access log; the keys are
validated with the rest of the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from promreflex.config import ConfigError, load_config
from promreflex.stack import Stack


def _cfg(tmp_path: Path, nginx: dict, **stack: object):
    f = tmp_path / "promreflex.yml"
    f.write_text(yaml.safe_dump({"stack": {"state_dir": str(tmp_path / "state"), "nginx": nginx, **stack}}))
    return load_config(f)


def test_external_nginx_is_not_started_and_its_sources_are_used(tmp_path):
    cfg = _cfg(tmp_path, {"external": True, "stub_status_url": "http://127.0.0.1:18480/nginx_status",
                          "access_log": "/var/log/nginx/promreflex-shop.log"})
    stack = Stack(cfg)
    names = [p.name for p in stack.processes]
    assert "nginx" not in names and "nginx_exporter" in names and "accesslog_exporter" in names
    argv = {c.name: c.argv for c in stack.components()}
    assert "-nginx.scrape-uri=http://127.0.0.1:18480/nginx_status" in argv["nginx_exporter"]
    assert any(a == "--log=shop=/var/log/nginx/promreflex-shop.log:nginx_timed" for a in argv["accesslog_exporter"])
    assert "nginx/nginx.conf" not in stack.files()  # nothing rendered for an nginx we do not run
    assert stack.site_url == "http://127.0.0.1:18480/" and stack.urls["nginx"] == stack.site_url
    assert stack.nginx_access_log == Path("/var/log/nginx/promreflex-shop.log")
    # the preflight port check covers only what the stack starts: the own nginx's ports are not ours
    ports = {name for p in stack.processes for name in p.ports}
    assert "nginx" not in ports and "nginx_stub_status" not in ports


def test_external_nginx_url_overrides_the_stub_status_origin(tmp_path):
    cfg = _cfg(tmp_path, {"external": True, "url": "https://shop.example/store/",
                          "stub_status_url": "http://127.0.0.1:81/status", "access_log": "/x/a.log"})
    assert Stack(cfg).site_url == "https://shop.example/store/"


def test_own_nginx_by_default(tmp_path):
    stack = Stack(_cfg(tmp_path, {}))
    assert "nginx" in [p.name for p in stack.processes]
    assert stack.site_url == stack.url("nginx") + "/"
    assert stack.nginx_access_log == stack.dir / "nginx" / "access.log"
    assert any("stub_status" in a for c in stack.components() if c.name == "nginx_exporter" for a in c.argv)


@pytest.mark.parametrize(("nginx", "extra", "problem"), [
    ({"external": True}, {}, "stack.nginx: external: true needs stub_status_url and access_log"),
    ({"external": True, "stub_status_url": "http://127.0.0.1:1/s", "access_log": "rel.log"}, {}, "must be an absolute path"),
    ({"external": True, "stub_status_url": "ftp://x/s", "access_log": "/a.log"}, {}, "stack.nginx.stub_status_url"),
    ({"access_log": "/a.log"}, {}, "only apply with external: true"),
    ({"external": True, "stub_status_url": "http://127.0.0.1:1/s", "access_log": "/a.log"}, {"upstream": "127.0.0.1:9"},
     "upstream configures the stack's own nginx"),
    ({"externel": True}, {}, "stack.nginx.externel"),
])
def test_bad_external_configuration_names_the_key(tmp_path, nginx, extra, problem):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, nginx, **extra)
    assert any(problem in p for p in e.value.problems), e.value.problems
