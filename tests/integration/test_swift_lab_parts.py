"""The swift lab's and bench's pure parts (no root, no Swift): the address plan, the checks on
the configuration, the delay middleware, and the bench's attribution verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.swift.report import attribution, latest_levels, rate_bps
from exporters.swift import lab_delay
from exporters.swift.lab import LabConfig, plan, prefix_for
from promreflex.errors import UserError


def test_plan_names_and_addresses(tmp_path: Path) -> None:
    cfg = LabConfig(lab_dir=tmp_path, subnet="10.200.7.0/24", storage_nodes=3).checked()
    nodes = plan(cfg)
    assert [(n.name, n.role, n.address) for n in nodes] == [
        ("client", "client", "10.200.7.10"), ("proxy", "proxy", "10.200.7.20"),
        ("s1", "storage", "10.200.7.31"), ("s2", "storage", "10.200.7.32"), ("s3", "storage", "10.200.7.33")]
    prefix = prefix_for(tmp_path)
    assert all(n.namespace == f"{prefix}-{n.name}" for n in nodes)
    assert prefix != prefix_for(tmp_path / "other") and len(prefix) == 10
    assert cfg.replicas == 3 and LabConfig(lab_dir=tmp_path, storage_nodes=2).checked().replicas == 2


@pytest.mark.parametrize("kwargs, words", [
    ({"subnet": "192.168.0.0/24"}, "10.200.0.0/16"),
    ({"subnet": "10.200.0.0/16"}, "a /24"),
    ({"subnet": "10.200.1.5/24"}, "not a network"),
    ({"storage_nodes": 9}, "1..8"),
    ({"storage_nodes": 2, "replicas": 3}, "--replicas must be 1..2"),
    ({"snaplen": 40}, "--snaplen"),
    ({"proxy_workers": 0}, "workers"),
])
def test_bad_configuration_is_one_clear_error(tmp_path: Path, kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(UserError, match="swift-lab: ") as e:
        LabConfig(lab_dir=tmp_path, **kwargs).checked()
    assert words in str(e.value) and "\n" not in str(e.value)


def test_delay_file_values_are_clamped_and_bad_ones_mean_no_delay(tmp_path: Path) -> None:
    f = tmp_path / "d"
    assert lab_delay.read_delay_ms(str(f)) == 0.0  # missing
    for text, want in [("50", 50.0), (" 12.5\n", 12.5), ("-3", 0.0), ("nan", 0.0), ("abc", 0.0), ("", 0.0),
                       ("1e9", lab_delay.MAX_DELAY_MS)]:
        f.write_text(text)
        assert lab_delay.read_delay_ms(str(f)) == want, text


def test_delay_middleware_delays_only_the_listed_methods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(lab_delay, "_sleep", slept.append)
    f = tmp_path / "d"
    f.write_text("40")
    calls: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        calls.append(environ["REQUEST_METHOD"])
        return [b"ok"]

    def start_response(*_: Any) -> None:
        return None

    mw = lab_delay.filter_factory({}, delay_file=str(f), methods="PUT,GET", reload_interval="0")(app)
    assert mw({"REQUEST_METHOD": "PUT"}, start_response) == [b"ok"]
    assert mw({"REQUEST_METHOD": "HEAD"}, start_response) == [b"ok"]
    f.write_text("0")
    mw({"REQUEST_METHOD": "GET"}, start_response)
    assert slept == [0.04] and calls == ["PUT", "HEAD", "GET"]


def test_rates_in_tc_units() -> None:
    assert rate_bps("40mbit") == 40e6 and rate_bps("500kbit") == 5e5 and rate_bps("1gbit") == 1e9
    with pytest.raises(ValueError):
        rate_bps("40mbps")


def _run(arm: str, service: dict[str, float], transfer: dict[str, float], seg: dict[str, float],
         scenario: str = "slow-node", node: str = "s2", latency: float = 0.02) -> dict[str, Any]:
    size = 1024 if scenario == "slow-node" else 1024 * 1024
    return {"scenario": scenario, "node": node, "arm": arm, "op": "put", "size": size, "round": 0,
            "injected": {"delay_ms": 50.0} if scenario == "slow-node" else {"tbf_rate": "40mbit"},
            "latency_s": {"mean": latency},
            "breakdown": {"processing_by_service_ms": service, "transfer_ms": transfer, "hop_ms": transfer,
                          "segment_transit_ms": {k: {"mean": v} for k, v in seg.items()}}}


def test_attribution_names_the_injected_node_and_its_error() -> None:
    seg = {"proxy->s1": 0.004, "proxy->s2": 0.004}
    records = [
        _run("baseline", {"s1/object": 6.0, "s2/object": 6.0, "proxy/proxy": 3.0}, {"proxy->s2/object": 3.0}, seg),
        _run("treatment", {"s1/object": 7.0, "s2/object": 58.0, "proxy/proxy": 3.5}, {"proxy->s2/object": 3.1}, seg,
             latency=0.07),
    ]
    [a] = attribution(records)
    assert a["target"] == "s2/object" and a["attributed_right"] is True
    assert a["measured_ms"] == 52.0 and a["error_ms"] == 2.0 and a["error_pct"] == 4.0
    assert a["largest_elsewhere"] == {"where": "s1/object", "ms": 1.0} and a["clean"] is True
    assert a["client_latency_ms"] == {"baseline": 20.0, "treatment": 70.0}


def test_attribution_says_wrong_when_the_time_lands_elsewhere() -> None:
    seg_b = {"proxy->s1": 0.004, "proxy->s2": 0.004}
    seg_t = {"proxy->s1": 0.004, "proxy->s2": 30.0}
    records = [
        _run("baseline", {"s1/object": 5.0}, {"proxy->s1/object": 10.0, "proxy->s2/object": 10.0}, seg_b,
             scenario="slow-link", node="s1"),
        _run("treatment", {"s1/object": 5.0}, {"proxy->s1/object": 12.0, "proxy->s2/object": 200.0}, seg_t,
             scenario="slow-link", node="s1"),
    ]
    [a] = attribution(records)
    assert a["target"] == "proxy->s1/object" and a["attributed_right"] is False
    assert a["largest_change"] == "proxy->s2/object"
    assert round(a["expected_ms"]) == 219  # 1 MiB with Ethernet/IP/TCP headers at 40 Mbit/s
    assert a["segment_largest"] == {"where": "proxy->s2", "ms": 29.996}


def test_a_rerun_level_replaces_the_earlier_one() -> None:
    recs = [{"op": "put", "size": 1, "concurrency": 4, "n": 1}, {"op": "put", "size": 1, "concurrency": 4, "n": 2},
            {"op": "get", "size": 1, "concurrency": 4, "n": 3}]
    assert [r["n"] for r in latest_levels(recs)] == [2, 3]
