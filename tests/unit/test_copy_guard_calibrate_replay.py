"""``promreflex calibrate --replay`` of a log in your own format (a stranger's review,
/tmp/review-guard, M3): JSON logs (``log_format ... escape=json``), the format given as nginx's
``log_format`` string (compiled by the access-log exporter's own parser), what it says when it
cannot read a log, and our own traffic left out whatever follows the user agent."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from controllers.copy_guard import calibrate as cal

# the reviewer's log_format, as in their nginx.conf
MINE = ("escape=json '{\"time\":\"$time_iso8601\",\"remote\":\"$remote_addr\",\"host\":\"$host\",\"request\":\"$request\","
        "\"status\":$status,\"bytes\":$body_bytes_sent,\"ua\":\"$http_user_agent\",\"rt\":$request_time,"
        "\"urt\":\"$upstream_response_time\"}'")


def json_line(request: str, status: int = 200, ua: str = "curl/7.88.1") -> str:
    return ('{"time":"2026-11-27T16:20:52+00:00","remote":"127.0.0.1","host":"127.0.0.1","request":"' + request
            + f'","status":{status},"bytes":54,"ua":"{ua}","rt":0.010,"urt":"0.011"}}\n')


def args(**kw: Any) -> argparse.Namespace:
    d: dict[str, Any] = {"request": None, "profile": None, "replay": None, "replay_top": 500, "replay_log_format": None}
    d.update(kw)
    return argparse.Namespace(**d)


def test_a_json_log_is_replayed(tmp_path: Path) -> None:
    """`log_format mine escape=json '{..."request":"$request","status":$status,...}'` gave
    "not a request line: 406" and no word of what --replay reads."""
    log = tmp_path / "access.json"
    log.write_text(json_line("GET /product/1 HTTP/1.1") * 3 + json_line("GET /product/2 HTTP/1.1")
                   + json_line('GET /search?q=\\"shoe\\" HTTP/1.1')  # escape=json: \" in the value
                   + json_line("GET /metrics HTTP/1.1", ua="x")
                   + json_line("GET /product/9 HTTP/1.1", ua="Prometheus/2.42.0")
                   + json_line("GET /gone HTTP/1.1", status=404)
                   + json_line("POST /cart HTTP/1.1"))
    reqs, _, what = cal.build_profile(args(replay=log))
    assert [(r.path, r.weight) for r in reqs] == [("/product/1", 3.0), ("/product/2", 1.0), ("/search?q=%22shoe%22", 1.0)]
    assert "our own traffic 2" in what and "status 4xx 1" in what and "POST (no body in the log) 1" in what
    # the same given as the log_format string (pasted as it is in nginx.conf): the exporter's parser
    reqs2, _, _ = cal.build_profile(args(replay=log, replay_log_format=MINE))
    assert reqs2 == reqs
    # JSON with the method and the URI apart, and keys in another case
    other = tmp_path / "other.json"
    other.write_text('{"Request-Method":"GET","Request-URI":"/a?b=1","Status":"200","User-Agent":"Mozilla/5.0"}\n'
                     '{"request_method":"GET","uri":"/b","status":200,"http_user_agent":"Blackbox Exporter/0.24.0"}\n'
                     '{"request_method":"HEAD","request_uri":"/c","status":301}\n')
    reqs3, skipped = cal.read_replay(other)
    assert [(r.method, r.path) for r in reqs3] == [("GET", "/a?b=1"), ("HEAD", "/c")] and skipped == {"our own traffic": 1}


def test_a_log_it_cannot_read_names_what_it_reads_and_the_way_out(tmp_path: Path) -> None:
    log = tmp_path / "custom.log"
    log.write_text("2026-11-27T16:20:52 127.0.0.1 GET /product/1 200 0.010\n" * 5)
    with pytest.raises(cal.CalibrationError) as e:
        cal.build_profile(args(replay=log))
    said = str(e.value)
    assert "no GET/HEAD" in said and "{'not a request line': 5}" in said
    assert "combined-like lines" in said and "JSON lines" in said and "--replay-log-format" in said
    assert "the promreflex log of README step 1" in said
    # the format given: read
    reqs, _, _ = cal.build_profile(args(replay=log, replay_log_format="$time_iso8601 $remote_addr $request_method "
                                                                        "$request_uri $status $request_time"))
    assert [r.path for r in reqs] == ["/product/1"]
    # a log_format that cannot be read, or lacks what a replay needs: said before the file is read
    with pytest.raises(cal.CalibrationError, match=r"needs \$status and \$request"):
        cal.build_profile(args(replay=log, replay_log_format="$time_iso8601 $remote_addr"))
    with pytest.raises(cal.CalibrationError, match="directly followed"):
        cal.build_profile(args(replay=log, replay_log_format="$request$status"))
    # a wrong --replay-log-format: said so
    with pytest.raises(cal.CalibrationError, match="not in the --replay-log-format given"):
        cal.build_profile(args(replay=log, replay_log_format='"$request" $status'))


def test_our_own_traffic_is_left_out_whatever_follows_the_user_agent() -> None:
    """A format ending in plain `$request_time $upstream_response_time` (no `rt=`): the user agent
    was not found, and Prometheus' own scrapes were replayed as visitors."""
    head = '127.0.0.1 - - [27/Nov/2026:16:21:28 +0000] "GET /product/9 HTTP/1.1" 200 54 "-" '
    lines = [head + '"Prometheus/2.42.0" 0.008 0.009', head + '"Prometheus/2.42.0" 0.008 -',
             head + '"NGINX-Prometheus-Exporter/v0.11.0" "10.0.0.1, 10.0.0.2"',  # + $http_x_forwarded_for
             'shop.example:443 ' + head + '"Prometheus/2.42.0"',  # Apache's vhost_combined
             head + '"promreflex-calibrate" 0.008 0.009',
             head + '"Mozilla/5.0" 0.008 0.009', head + '"Mozilla/5.0 (compatible; PrometheusFanBot)" 0.1 0.1',
             head.replace('"-"', '"https://grafana.example/d/prometheus-stats"') + '"Mozilla/5.0" 0.008 0.009']
    reqs, skipped = cal.replay_profile(lines)
    assert reqs == [cal.Request("GET", "/product/9", 3.0)] and skipped == {"our own traffic": 5}
    # a line only the loose search reads (an Apache \" in the request): our agent in any quoted field
    odd = '127.0.0.1 - - [27/Nov/2026:16:21:28 +0000] "GET /a?q=\\"b\\" HTTP/1.1" 200 54 "-" "Prometheus/2.42.0" 1 2'
    assert cal.replay_profile([odd]) == ([], {"our own traffic": 1})
