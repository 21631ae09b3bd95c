"""The admission bench's arms: the proxy configuration it writes is one the proxy accepts, and
nginx's limits appear only in the nginx-limit arm."""

from __future__ import annotations

import re

from bench.admission.arms import NginxLimits, nginx_conf, proxy_config
from bench.admission.pages import PAGES, STATIC_PATH
from controllers.admission.config import AdmissionSection


def test_proxy_config_is_valid_and_classes_every_page_of_the_session() -> None:
    for full in (True, False):
        section = AdmissionSection.model_validate(proxy_config(8001, 8002, 8003, 0.1, full)["admission"])
        assert section.session_scheduler.enabled is full
        assert section.upstream == "http://127.0.0.1:8002"
        for p in PAGES:  # every path of the session falls in its own page class, logout ends it
            matched = [c for c in section.pages if re.search(c.pattern, p.path)]
            assert [c.name for c in matched][:1] == [p.name]
            assert matched[0].logout is p.logout
        assert any(re.search(e, STATIC_PATH) for e in section.exempt)
        assert not any(re.search(e, p.path) for e in section.exempt for p in PAGES)


def test_proxy_config_scales_its_windows_and_applies_overrides() -> None:
    cfg = proxy_config(1, 2, 3, 0.2, True, {"session_scheduler.queue_threshold": 4, "page_scheduler.window": 0.5})
    section = AdmissionSection.model_validate(cfg["admission"])
    assert section.session_scheduler.queue_threshold == 4
    assert section.page_scheduler.window == 0.5
    assert section.session.idle_timeout == 24.0  # the paper's 2 minutes x 0.2


def test_proxy_config_derives_its_waits_from_the_scaled_client_timeout() -> None:
    """No tuning in the bench: the clients' patience is scaled like every duration, and the
    session queue wait and page-wait target are the proxy's defaults derived from it."""
    section = AdmissionSection.model_validate(proxy_config(1, 2, 3, 0.1, True)["admission"])
    assert section.session.client_timeout == 6.0  # the paper's 60 s x 0.1
    assert section.session.max_queue_wait == 3.0
    assert section.session_scheduler.page_wait_target == 1.0
    raw = proxy_config(1, 2, 3, 0.1, True)["admission"]
    assert "max_queue_wait" not in raw["session"] and "page_wait_target" not in raw.get("session_scheduler", {})


def test_nginx_limits_only_in_the_limit_arm() -> None:
    plain = nginx_conf(8080, 8000, None)
    limited = nginx_conf(8080, 8000, NginxLimits(rate_per_s=120, burst=120, conn=8))
    assert "limit_req" not in plain and "limit_conn" not in plain
    assert "rate=120r/s" in limited and "limit_conn site_conn 8;" in limited and "burst=120;" in limited
    assert "limit_req_status 503;" in limited
    for conf in (plain, limited):
        assert "listen 127.0.0.1:8080" in conf and "server 127.0.0.1:8000" in conf
        assert conf.count("{") == conf.count("}")


def test_the_report_names_every_key_the_bench_sets() -> None:
    from bench.admission.run import bench_keys

    keys = bench_keys(proxy_config(1, 2, 3, 0.1, True)["admission"])
    assert "`session.client_timeout` 6.0" in keys and "`session.idle_timeout` 12.0" in keys
    assert "max_queue_wait` 3" not in keys and "page_wait_target" not in keys
    assert "`session.max_queue_wait` 3" in bench_keys(proxy_config(1, 2, 3, 0.1, True, {"session.max_queue_wait": 3})["admission"])
