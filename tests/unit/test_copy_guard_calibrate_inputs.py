"""What ``promreflex calibrate`` sends (controllers/copy_guard/calibrate.py and its locustfile):
the paths, bodies and content types of ``--request``, ``--profile`` and ``--replay``, and the
inputs it refuses (a stranger's review, section B: B1-B7). The locustfile is not imported (it
patches the standard library with gevent): its functions are run alone, on the profile file
calibrate writes for it."""

from __future__ import annotations

import argparse
import ast
import base64
import gzip
import itertools
import json
import os
import random
import re
import textwrap
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from controllers.copy_guard import calibrate as cal

LINE = '192.0.2.1 - - [27/Nov/2026:13:00:00 +0000] "{req}" {status} 5 "-" "{agent}"\n'


def log_line(req: str, status: int = 200, agent: str = "Mozilla/5.0") -> str:
    return LINE.format(req=req, status=status, agent=agent)


def args(**kw: Any) -> argparse.Namespace:
    d: dict[str, Any] = {"request": None, "profile": None, "replay": None, "replay_top": 500}
    d.update(kw)
    return argparse.Namespace(**d)


def _locust_functions() -> dict[str, Any]:
    """The locustfile's load_profile, fill, request_path (when it has one) and Shopper.one_request."""
    src = cal.LOCUSTFILE.read_text()
    tree = ast.parse(src)
    ns: dict[str, Any] = {"json": json, "random": random, "re": re, "os": os, "base64": base64, "Any": Any,
                          "itertools": itertools, "_uniq": itertools.count(), "_PLACEHOLDER": re.compile(r"\{(\w+)\}"),
                          "USER_AGENT": "promreflex-calibrate"}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in ("load_profile", "fill", "request_path"):
            exec(ast.get_source_segment(src, node), ns)  # noqa: S102 - our own file
        if isinstance(node, ast.ClassDef) and node.name == "Shopper":
            method = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "one_request")
            exec(textwrap.dedent(ast.get_source_segment(src, method, padded=True) or ""), ns)  # noqa: S102
    return ns


def sent(target: str, requests: list[cal.Request], variables: dict[str, list[str]] | None = None
         ) -> list[tuple[str, str, Any, dict[str, str]]]:
    """(method, path, body, headers) the locustfile sends for each of ``requests`` under ``target``."""
    load = cal.ShopLoad(target, 0, 1, 5, profile=requests, variables=variables)
    try:
        ns = _locust_functions()
        opts = SimpleNamespace(profile_file=load.argv[load.argv.index("--profile-file") + 1], product_count=10,
                               checkout_share=0.1)
        base, reqs, variables_ = ns["load_profile"](opts)
        out: list[tuple[str, str, Any, dict[str, str]]] = []

        class Client:
            def request(self, method: str, path: str, data: Any = None, headers: Any = None, **_kw: Any) -> None:
                out.append((method, path, data, dict(headers or {})))

        for r in reqs:
            user = SimpleNamespace(environment=SimpleNamespace(parsed_options=opts), base=base, requests=[r],
                                   weights=[1.0], variables=variables_, client=Client())
            ns["one_request"](user)
        return out
    finally:
        load.kill()


# ------------------------------------------------------------------ B1: replayed paths are site-absolute
def test_replayed_paths_are_sent_as_the_log_has_them_not_under_the_target_path(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text(log_line("GET /store/p1 HTTP/1.1") + log_line("GET /store/p1 HTTP/1.1")
                   + log_line("GET /store/tpl/{id}/{uniq} HTTP/1.1"))
    reqs, _, what = cal.build_profile(args(replay=log, request=[cal.parse_request("GET /cart 1")]))
    assert "2 path(s) replayed" in what
    paths = [p for _, p, _, _ in sent("http://127.0.0.1:9/store/", reqs)]
    # --request paths keep their meaning (under the target's path); the log's are the shop's own
    # (B7: a literal {id} in a visitor's path is no placeholder)
    assert paths == ["/store/cart", "/store/p1", "/store/tpl/{id}/{uniq}"]
    assert [p for _, p, _, _ in sent("http://127.0.0.1:9/", reqs)] == ["/cart", "/store/p1", "/store/tpl/{id}/{uniq}"]
    assert "site-absolute" in (cal.__doc__ or "") and "under the path of --target" in _help()


def _help() -> str:
    parser = argparse.ArgumentParser()
    p = cal.register(parser.add_subparsers(dest="command"))
    return " ".join(p.format_help().split())


# ------------------------------------------------------------------ B2: the fallback is the target URL itself
@pytest.mark.parametrize(("target", "path"), [
    ("http://127.0.0.1:9/page.html", "/page.html"),
    ("http://127.0.0.1:9/search?q=x", "/search?q=x"),
    ("http://127.0.0.1:9/store/", "/store/"),
    ("http://127.0.0.1:9", "/"),
])
def test_without_requests_the_target_url_itself_is_requested(target: str, path: str) -> None:
    reqs, _, what = cal.build_profile(args(target=target))
    assert "GET of the --target URL" in what
    assert [(m, p) for m, p, _, _ in sent(target, reqs)] == [("GET", path)]


# ------------------------------------------------------------------ B4, B5: bodies as given
def test_request_bodies_are_kept_exactly_and_json_is_sent_as_json() -> None:
    body = '{"sku": "A1", "qty": 2}'
    assert cal.parse_request(f"POST /api/cart 1 {body}") == cal.Request("POST", "/api/cart", 1.0, body)
    for raw in ("a=1  b=2", r"path=C:\temp\x", "note=it's", "q=a#b", 'x="quoted" y'):
        assert cal.parse_request(f"POST /c 2 {raw}").body == raw
    assert cal.parse_request("/about 2 a=1  b") == cal.Request("GET", "/about", 2.0, "a=1  b")
    reqs = [cal.parse_request(f"POST /api/cart 1 {body}"), cal.parse_request("POST /checkout 1 cart=1&qty={id}"),
            cal.parse_request("POST /c 1 [1, 2]"), cal.parse_request("POST /c 1 {not json")]
    got = sent("http://127.0.0.1:9/", reqs)
    assert got[0][2] == body and got[0][3]["Content-Type"] == "application/json"
    assert re.fullmatch(r"cart=1&qty=\d", got[1][2]) and got[1][3]["Content-Type"] == "application/x-www-form-urlencoded"
    assert got[2][3]["Content-Type"] == "application/json"
    assert got[3][3]["Content-Type"] == "application/x-www-form-urlencoded"
    assert "application/json" in _help()


def test_profile_bodies_mapping_as_json_binary_as_bytes(tmp_path: Path) -> None:
    f = tmp_path / "p.yml"
    f.write_text('requests:\n  - {method: POST, path: /api/cart, body: {sku: A1, qty: 2}}\n'
                 '  - {method: POST, path: /upload, body: !!binary "AAEC/w=="}\n'
                 '  - {method: POST, path: /c, body: "a=1  b=\'2\'"}\n')
    reqs, _ = cal.read_profile(f)
    assert json.loads(str(reqs[0].body)) == {"sku": "A1", "qty": 2} and reqs[1].body == b"\x00\x01\x02\xff"
    got = sent("http://127.0.0.1:9/shop/", reqs)
    assert json.loads(got[0][2]) == {"sku": "A1", "qty": 2} and got[0][3]["Content-Type"] == "application/json"
    assert got[1][1] == "/shop/upload" and got[1][2] == b"\x00\x01\x02\xff"
    assert got[1][3]["Content-Type"] == "application/octet-stream"
    assert got[2][2] == "a=1  b='2'"
    f.write_text("requests:\n  - {method: POST, path: /c, body: true}\n")
    with pytest.raises(ValueError, match=r"requests\[0\].*body"):
        cal.read_profile(f)


# ------------------------------------------------------------------ B3: bounded reading
def test_replay_reads_lines_in_bounded_pieces(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_bytes(b"\0" * (3 * 64 * 1024 + 5) + b"\n" + log_line("GET /ok HTTP/1.1").encode())
    reqs, _, what = cal.build_profile(args(replay=log))
    assert [r.path for r in reqs] == ["/ok"] and "longer than 64 KiB 1" in what
    big = tmp_path / "binary"
    big.write_bytes(b"x" + os.urandom(1 << 20).replace(b"\n", b"x") * 16)  # 16 MiB, no newline
    tracemalloc.start()
    try:
        with pytest.raises(cal.CalibrationError, match="no GET/HEAD"):
            cal.build_profile(args(replay=big))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # never the whole "line"
    with pytest.raises(cal.CalibrationError, match="device"):  # /dev/zero, /dev/urandom: a device never ends
        cal.build_profile(args(replay=Path(os.devnull)))


def test_replay_refuses_a_gzip_file(tmp_path: Path) -> None:
    gz = tmp_path / "access.log.2.gz"
    gz.write_bytes(gzip.compress(log_line("GET /ok HTTP/1.1").encode()))
    with pytest.raises(cal.CalibrationError, match="gzip-compressed: decompress it first"):
        cal.build_profile(args(replay=gz))


# ------------------------------------------------------------------ B6: weights that overflow together
def test_weights_whose_sum_is_not_finite_are_refused() -> None:
    reqs = [cal.parse_request("GET /a 1e308"), cal.parse_request("GET /b 1e308")]
    with pytest.raises(cal.CalibrationError, match="weights add up to inf"):
        cal.build_profile(args(request=reqs))
    assert cal.build_profile(args(request=reqs[:1]))[0] == reqs[:1]


# ------------------------------------------------------------------ B7: the replay keeps valid lines as they were
def test_replay_absolute_uris_escapes_and_own_traffic_by_token() -> None:
    lines = [
        log_line("GET http://shop.example/store/cart HTTP/1.1"),
        log_line("GET https://shop.example HTTP/1.1"),
        log_line(r"GET /store/search?q=\x22shoe\x22&u=\xC3\xA9 HTTP/1.1"),
        log_line(r"GET /apache?q=\"bag\" HTTP/1.1"),
        log_line("GET /metrics-dashboard HTTP/1.1"),
        log_line("GET /store/p HTTP/1.1", agent="Mozilla/5.0 (compatible; PrometheusFanBot)"),
        log_line("GET /metrics HTTP/1.1", agent="x"),
        log_line("GET /metrics/x?y HTTP/1.1", agent="x"),
        log_line("GET /-/healthy HTTP/1.1", agent="x"),
        log_line("GET /a HTTP/1.1", agent="Prometheus/2.45.0"),
        log_line("GET /a HTTP/1.1", agent="Blackbox Exporter/0.24.0"),
        log_line("GET /a HTTP/1.1", agent="promreflex-calibrate"),
        log_line("GET /a HTTP/1.1", agent="NGINX-Prometheus-Exporter/v0.11.0"),
    ]
    reqs, skipped = cal.replay_profile(lines)
    assert [r.path for r in reqs] == ["/store/cart", "/", "/store/search?q=%22shoe%22&u=%C3%A9", "/apache?q=%22bag%22",
                                      "/metrics-dashboard", "/store/p"]
    assert skipped == {"our own traffic": 7}


def test_replay_top_below_one_and_a_profile_not_utf8_are_refused_clearly(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_text(log_line("GET /ok HTTP/1.1"))
    for top in (0, -1):
        with pytest.raises(cal.CalibrationError, match="--replay-top"):
            cal.build_profile(args(replay=log, replay_top=top))
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"requests": [{"path": "/\xff"}]}')
    with pytest.raises(ValueError, match="bad.json is not UTF-8"):
        cal.read_profile(bad)
