"""Configuration, the runnable exporter (oneshot and served on loopback), the writer round trip."""

from __future__ import annotations

import argparse
import asyncio
import urllib.request
from datetime import datetime, UTC
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from exporters.mesh import cli
from exporters.mesh.collector import MeshExporter
from exporters.mesh.config import MeshExporterConfig, load_mesh_config
from exporters.mesh.envoy_format import ISTIO_TEXT
from exporters.mesh.json_format import ISTIO_JSON
from exporters.mesh.writer import AccessLogWriter, inbound_cluster, outbound_cluster
from promreflex.config import ConfigError
from promreflex.proc import free_port, wait_until

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "mesh"

RECORD = {
    "start_time": datetime(2024, 3, 1, 12, 0, 0, 123000, tzinfo=UTC),
    "method": "GET",
    "path": "/carts/1/items",
    "protocol": "HTTP/1.1",
    "response_code": 200,
    "response_flags": (),
    "response_code_details": "via_upstream",
    "bytes_received": 0,
    "bytes_sent": 42,
    "duration": 3200,
    "upstream_service_time": 3190,
    "user_agent": "node-fetch/1.0",
    "request_id": "rid-1",
    "authority": "carts:80",
    "upstream_host": "10.1.0.22:80",
    "upstream_cluster": outbound_cluster("carts", "sock-shop", 80),
    "route_name": "default",
}


def write_config(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "mesh.yml"
    p.write_text(yaml.safe_dump(data))
    return p


# ---------------------------------------------------------------- configuration


def test_valid_config_with_defaults(tmp_path: Path) -> None:
    cfg = load_mesh_config(
        write_config(
            tmp_path,
            {
                "logs": [
                    {"workload": "front-end", "path": str(FIXTURES / "front-end.log")},
                    {"workload": "orders", "path": "/x.log", "format": "envoy", "format_string": "%RESPONSE_CODE% %DURATION%"},
                ]
            },
        )
    )
    assert cfg.listen_address == "127.0.0.1:9182"
    assert [s.format for s in cfg.logs] == ["istio_text", "envoy"]


def test_invalid_config_names_every_problem(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        {
            "listen_address": "nowhere",
            "colour": "blue",
            "logs": [
                {"workload": "Front_End", "path": "/a.log"},
                {"workload": "carts", "path": "/b.log", "format": "envoy", "format_string": "50% off"},
                # (format envoy without format_string is Envoy's default format: valid)
                {"workload": "orders", "path": "/c.log", "format": "ztunnel", "json_format": {"d": "%DURATION%"}},
                {"workload": "user", "path": "/d.log", "format_string": "%DURATION%"},
            ],
        },
    )
    with pytest.raises(ConfigError) as e:
        load_mesh_config(path)
    text = "\n".join(e.value.problems)
    assert "listen_address" in text and "colour" in text
    assert "logs[0].workload" in text
    assert "logs[1]" in text and "starts no operator" in text
    assert "logs[2]" in text and "json_format is only for format 'istio_json'" in text
    assert "logs[3]" in text and "only for format 'envoy'" in text


def test_config_rejects_unknown_format_and_duplicate_paths() -> None:
    with pytest.raises(Exception) as e:
        MeshExporterConfig.model_validate({"logs": [{"workload": "a", "path": "/x", "format": "nginx"}]})
    assert "format" in str(e.value)
    with pytest.raises(Exception) as e:
        MeshExporterConfig.model_validate({"logs": [{"workload": "a", "path": "/x"}, {"workload": "b", "path": "/x"}]})
    assert "once" in str(e.value)


# ---------------------------------------------------------------- CLI


def test_register_adds_exporter_mesh_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="promreflex")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["exporter-mesh", "--config.file", "m.yml", "--web.listen-address", "127.0.0.1:1"])
    assert args.func is cli.run and args.config_file == "m.yml" and args.listen_address == "127.0.0.1:1"


def test_oneshot_prints_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, {"logs": [{"workload": "front-end", "path": str(FIXTURES / "front-end.log")}]})
    assert cli.main(["--config.file", str(path), "--oneshot"]) == 0
    out = capsys.readouterr().out
    assert 'promreflex_mesh_lines_total{workload="front-end"} 13.0' in out
    assert 'promreflex_mesh_parse_errors_total{reason="format_mismatch",workload="front-end"} 3.0' in out
    assert 'promreflex_mesh_edge_info{destination="orders",source="front-end"} 1.0' in out


def test_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, {"logs": []})
    assert cli.main(["--config.file", str(path)]) == 2
    assert "logs" in capsys.readouterr().err


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback
        return resp.read().decode()


async def test_serve_follows_a_growing_log(tmp_path: Path) -> None:
    log = tmp_path / "front-end.log"
    log.write_text("")
    port = free_port()
    cfg = MeshExporterConfig.model_validate(
        {
            "listen_address": f"127.0.0.1:{port}",
            "logs": [{"workload": "front-end", "path": str(log)}],
            "poll_interval": "50ms",
            "state_dir": str(tmp_path / "state"),
        }
    )
    stop = asyncio.Event()
    task = asyncio.create_task(cli.serve(cfg, CollectorRegistry(), stop))
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        await asyncio.to_thread(
            wait_until, lambda: 'lines_total{workload="front-end"} 0.0' in scrape(url), 20, 0.05, "exporter up"
        )
        with AccessLogWriter(log) as w:
            w.write(RECORD)
            w.write(dict(RECORD, response_code=503, response_flags=("UH",), duration=1))
        with open(log, "a") as f:
            f.write("garbage\n")
        want = 'promreflex_mesh_requests_total{code_class="5xx",destination="carts",response_flags="UH",source="front-end"} 1.0'
        text = await asyncio.to_thread(wait_until, lambda: want in (t := scrape(url)) and t, 20, 0.05, "records counted")
        assert 'lines_total{workload="front-end"} 3.0' in text
        assert 'parse_errors_total{reason="format_mismatch",workload="front-end"} 1.0' in text
        assert 'request_duration_seconds_bucket{destination="carts",le="3.0",source="front-end"} 1.0' in text
        assert 'request_duration_seconds_bucket{destination="carts",le="5.0",source="front-end"} 2.0' in text
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
    assert list((tmp_path / "state").glob("mesh-front-end-*.json"))  # read position persisted


def test_sighup_does_not_stop_the_exporter(tmp_path: Path) -> None:
    """A logrotate ``postrotate`` that signals the log readers (the access-log exporter's README
    recipe) killed the mesh exporter: SIGHUP's default action. It re-checks the logs now."""
    import os
    import signal
    import subprocess
    import sys

    log = tmp_path / "front-end.log"
    log.write_text("")
    port = free_port()
    config = tmp_path / "mesh.yml"
    config.write_text(yaml.safe_dump({"listen_address": f"127.0.0.1:{port}", "poll_interval": "50ms",
                                      "logs": [{"workload": "front-end", "path": str(log)}]}))
    proc = subprocess.Popen([sys.executable, "-m", "promreflex", "exporter-mesh", "--config.file", str(config)],
                            cwd=Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_until(lambda: "promreflex_mesh_lines_total" in scrape(url), 30, 0.1, "exporter up")
        os.kill(proc.pid, signal.SIGHUP)
        with AccessLogWriter(log) as w:
            w.write(RECORD)
        wait_until(lambda: 'lines_total{workload="front-end"} 1.0' in scrape(url), 30, 0.1, "a line after SIGHUP")
        assert proc.poll() is None
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert "SIGHUP: re-checking every log now" in err.decode()


# ---------------------------------------------------------------- writer round trip


@pytest.mark.parametrize(
    ("fmt", "runtime"),
    [("istio_text", None), ("istio_text", "cri"), ("istio_json", "docker"), ("istio_text_legacy", "docker")],
)
def test_writer_round_trip_through_a_stream(tmp_path: Path, fmt: str, runtime: str | None) -> None:
    path = tmp_path / "log"
    records = [
        RECORD,
        dict(RECORD, response_code=503, response_flags=("UF", "URX"), upstream_service_time=None, upstream_host=None),
        dict(RECORD, upstream_cluster=inbound_cluster(80), authority="carts:80", request_id="rid-2"),
    ]
    with AccessLogWriter(path, fmt, runtime=runtime) as w:
        for r in records:
            w.write(r)
    reg = CollectorRegistry()
    stream = MeshExporter(registry=reg).add_stream("front-end", fmt)
    stats = stream.feed(path.read_text().splitlines())
    assert (stats.parsed, dict(stats.rejected)) == (3, {})
    parser = stream.format
    for r in records:
        line = parser.format(r)
        back = parser.parse(line)
        assert {k: back.get(k) for k in r if k in back} == {k: v for k, v in r.items() if k in back}
        assert parser.format(back) == line
    assert reg.get_sample_value(
        "promreflex_mesh_requests_total",
        {"source": "unknown", "destination": "front-end", "code_class": "2xx", "response_flags": "none"},
    ) == 1


def test_writer_lines_match_the_istio_layout() -> None:
    assert ISTIO_TEXT.format(RECORD).startswith(
        '[2024-03-01T12:00:00.123Z] "GET /carts/1/items HTTP/1.1" 200 - via_upstream - "-" 0 42 3200 3190 "-" "node-fetch/1.0"'
    )
    assert ISTIO_TEXT.format(RECORD).endswith("outbound|80||carts.sock-shop.svc.cluster.local - - - - default")
    assert ISTIO_JSON.parse(ISTIO_JSON.format(RECORD))["upstream_cluster"] == RECORD["upstream_cluster"]


def test_example_config_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "exporters" / "mesh" / "example.yml"
    cfg = load_mesh_config(example)
    assert [s.workload for s in cfg.logs] == ["front-end", "carts", "orders"]
    assert cfg.logs[2].format == "envoy" and cfg.namespaces == ["sock-shop"]
