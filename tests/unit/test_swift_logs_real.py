"""Swift access logs as operators have them: through syslog, with queries, long or cut names,
behind a load balancer; and the mistakes around them said, not silent."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from urllib.parse import quote

import pytest

from exporters.swift.analyze import analyze
from exporters.swift.cli import main
from exporters.swift.exchanges import CUT, Exchange, _parse_request
from exporters.swift.pcap import ip_int
from exporters.swift.roles import RoleMap
from exporters.swift.swiftlogs import apply_logs, parse_line
from exporters.swift.synth import roles_mapping
from tests.unit.test_swift_logs import synthetic_puts

T = 1795448544.470043421
# The message after Swift's tag (its syslog format is "%(server)s: %(message)s").
PROXY_MSG = ("10.200.14.10 10.200.14.10 23/Nov/2026/15/42/24 PUT /v1/AUTH_test/c%20x/o HTTP/1.0 201 - "
             "python-swiftclient-4.11.0 AUTH_tk8b... - - - tx9a1b05be7868420ea7d7d-006b045ee0 - 0.0251 - - "
             "1795448544.470043421 1795448544.495098591 0")
OBJECT_MSG = ('10.200.14.20 - - [23/Nov/2026:15:42:24 +0000] "PUT /d1/822/AUTH_test/c/o" 201 - '
              '"PUT http://10.200.14.20:8080/v1/AUTH_test/c/o" "tx366c019b316e4c88aa343-006b045ee0" '
              '"proxy-server 29535" 0.0078 "-" 29537 0')


@pytest.mark.parametrize("line", [
    "Nov 23 15:42:24 px1 proxy-server: " + PROXY_MSG,  # rsyslog's default file format
    "Nov  3 15:42:24 px1 proxy-server: " + PROXY_MSG,  # a one-digit day
    "Nov 23 15:42:24 px1 proxy-server[1234]: " + PROXY_MSG,  # journald's short
    "Nov 23 15:42:24.470123 px1 proxy-server[1234]: " + PROXY_MSG,  # journalctl -o short-precise
    "2026-11-23T15:42:24.470123+00:00 px1 proxy-server: " + PROXY_MSG,  # RSYSLOG_FileFormat
    "2026-11-23T15:42:24+0000 px1 proxy-server[1234]: " + PROXY_MSG,  # journalctl -o short-iso
    "<134>1 2026-11-23T15:42:24.470Z px1 proxy-server 1234 - - " + PROXY_MSG,  # RFC 5424
    "<134>1 2026-11-23T15:42:24.470Z px1 proxy-server - - [x@1 a=\"b\"] proxy-server: " + PROXY_MSG,
    "<134>Nov 23 15:42:24 proxy-server: " + PROXY_MSG + "\r\n",  # raw RFC 3164, no host, CRLF
])
def test_syslog_headers_and_tags_are_read(line: str) -> None:
    p = parse_line(line)
    assert p is not None and p.remote == ip_int("10.200.14.10") and p.method == "PUT"
    assert p.path == "/v1/AUTH_test/c x/o" and p.trans_id.startswith("tx9a1b") and p.precise
    assert abs(p.start - 1795448544.470043421) < 1e-6


@pytest.mark.parametrize("prefix", ["Nov 23 15:42:24 s1 object-server: ",
                                    "2026-11-23T15:42:24.470123+00:00 s1 object-server[29537]: ",
                                    "<134>1 2026-11-23T15:42:24Z s1 object-server 29537 - - "])
def test_syslog_storage_lines_are_read(prefix: str) -> None:
    o = parse_line(prefix + OBJECT_MSG)
    assert o and o.remote == ip_int("10.200.14.20") and o.path == "/d1/822/AUTH_test/c/o" and not o.precise
    assert o.trans_id.startswith("tx366c") and abs(o.start - (1795448544.0 - 0.0078)) < 1e-6


def test_syslog_noise_is_still_skipped() -> None:
    assert parse_line("Nov 23 15:42:24 px1 proxy-server: STDERR: something went wrong") is None
    assert parse_line("Nov 23 15:42:24 px1 proxy-server: - - 23/Nov/2026/15/42/24 HEAD /v1/AUTH_t/c HTTP/1.0 "
                      "204 - Swift - - - - tx366c - 0.0025 VW - 1795448544.497 1795448544.499 0") is None
    assert parse_line("Nov 23 15:42:24 px1 kernel: [12.3] eth0: link up") is None
    assert parse_line(PROXY_MSG) is None  # no tag: not a Swift line


def _synthetic(tmp_path: Path) -> tuple[dict[str, Path], RoleMap, list[str], list[str]]:
    return synthetic_puts(tmp_path)[:4]


def test_an_rsyslog_written_proxy_log_gives_the_joins_their_ids(tmp_path: Path) -> None:
    """The reviewer's end-to-end case: the same lines with ``Nov 23 15:40:05 px1 `` in front gave 0."""
    paths, roles, txs, msgs = _synthetic(tmp_path)
    log = tmp_path / "proxy.log"
    log.write_text("".join(f"Nov 23 15:40:05 px1 proxy-server[77]: {m}\n" for m in msgs)
                   + "Nov 23 15:40:05 px1 proxy-server[77]: STDERR: noise\n")
    b = analyze(paths, roles, logs=[log])
    assert b.trans_ids_from_logs == 6 and not b.notes
    assert b.summary()["swift_logs"] == {str(log): {"access_lines": 3, "skipped_lines": 1}}
    assert {x.trans_id for x in b.exchanges if x.side == "server" and x.server_role == "proxy"} == set(txs)


def test_a_log_with_no_access_line_is_said(tmp_path: Path, capsys) -> None:
    paths, roles, _, msgs = _synthetic(tmp_path)
    bad = tmp_path / "messages"
    bad.write_text("Nov 23 15:40:05 px1 kernel: eth0 up\n" + "".join(f"{m}\n" for m in msgs))  # no tags
    b = analyze(paths, roles, logs=[bad])
    assert b.trans_ids_from_logs == 0
    assert len(b.notes) == 1 and str(bad) in b.notes[0] and "4 lines" in b.notes[0]
    assert b.summary()["notes"] == b.notes
    rfile = tmp_path / "roles.json"
    rfile.write_text(json.dumps(roles_mapping()))
    args = [f"--capture={n}={p}" for n, p in paths.items()] + [f"--roles={rfile}"]
    assert main(["analyze", *args, f"--swift-log={bad}", f"--json={tmp_path / 'o.json'}"]) == 0
    err = capsys.readouterr().err
    assert str(bad) in err and "no transaction id" in err and err.count("\n") == 1
    assert json.loads((tmp_path / "o.json").read_text())["notes"] == b.notes


def test_a_gzip_rotated_log_is_refused_by_name(tmp_path: Path, capsys) -> None:
    paths, _, _, msgs = _synthetic(tmp_path)
    gz = tmp_path / "proxy.log.1.gz"
    gz.write_bytes(gzip.compress("".join(f"Nov 23 15:40:05 px1 proxy-server: {m}\n" for m in msgs).encode()))
    rfile = tmp_path / "roles.json"
    rfile.write_text(json.dumps(roles_mapping()))
    args = [f"--capture={n}={p}" for n, p in paths.items()] + [f"--roles={rfile}"]
    assert main(["analyze", *args, f"--swift-log={gz}"]) == 1
    err = capsys.readouterr().err
    assert f"--swift-log {gz}: gzip-compressed, decompress it first" in err and err.count("\n") == 1


def test_serve_live_refuses_swift_log(tmp_path: Path, capsys) -> None:
    assert main(["serve", "--live", "proxy=-", f"--swift-log={tmp_path / 'nope.log'}"]) == 1
    err = capsys.readouterr().err
    assert "--swift-log" in err and "--live" in err and err.count("\n") == 1


# -- the join of one capture's request with one proxy line --------------------------------------

def _swift_logged(path_qs: str) -> str:
    """How Swift's proxy logs a path: the whole path_qs quoted (LogStringFormatter(quote=True))."""
    return quote(path_qs, safe=":/{}")


def _joined(head: bytes, logged_path: str, *, client: str = "10.0.0.10", remote: str = "10.0.0.10",
            method: str = "GET") -> str | None:
    m, _, _, target = _parse_request(head)
    line = (f"proxy-server: {client} {remote} 23/Nov/2026/15/42/24 {method} {logged_path} HTTP/1.0 200 - ua - - - - "
            f"txabc-0001 - 0.0251 - - {T:.9f} {T + 0.02:.9f} 0")
    r = parse_line(line)
    x = Exchange(node=1, side="server", client=(ip_int("10.0.0.10"), 40000), server=(ip_int("10.0.0.20"), 8080),
                 server_role="proxy", client_role="client", req_start=int(T * 1e9) + 100_000, req_end=0,
                 resp_start=0, resp_end=0, method=m, target=target)
    apply_logs([x], [r] if r else [])
    return x.trans_id


@pytest.mark.parametrize(("method", "path_qs"), [("GET", "/v1/AUTH_t/c?format=json"),
                                                 ("PUT", "/v1/AUTH_t/c/o?multipart-manifest=put")])
def test_a_quoted_query_is_cut_from_the_proxy_path(method: str, path_qs: str) -> None:
    assert parse_line(f"proxy-server: {PROXY_MSG}".replace("c%20x/o", "c%3Fformat%3Djson")).path == "/v1/AUTH_test/c"
    head = f"{method} {path_qs} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    assert _joined(head, _swift_logged(path_qs), method=method) == "txabc-0001"


@pytest.mark.parametrize("path", ["/v1/AUTH_t/c/" + "a" * 600, "/v1/AUTH_t/c/" + "é" * 100])
def test_a_target_longer_than_kept_is_a_prefix(path: str) -> None:
    quoted = quote(path)
    _, _, _, target = _parse_request(f"GET {quoted} HTTP/1.1\r\n\r\n".encode())
    assert target.endswith(CUT) and len(target) == 513
    assert _parse_request(b"GET /v1/AUTH_t/c/o HTTP/1.1\r\n\r\n")[3] == "/v1/AUTH_t/c/o"  # short: whole, no mark
    assert _joined(f"GET {quoted} HTTP/1.1\r\n\r\n".encode(), _swift_logged(path)) == "txabc-0001"


@pytest.mark.parametrize("cut", range(19, 29))
def test_a_cut_inside_an_escape_or_a_character_still_joins(cut: int) -> None:
    """``/v1/AUTH_t/c/r%C3%A9sum%C3%A9...`` cut at 19..28 bytes: inside ``%C3``, between the two
    bytes of ``é``, or after a lone ``%``."""
    full = f"GET /v1/AUTH_t/c/{quote('résumé-2026.pdf')} HTTP/1.1\r\nHost: x\r\n".encode()
    assert _joined(full[:cut], _swift_logged("/v1/AUTH_t/c/résumé-2026.pdf")) == "txabc-0001"


def test_a_cut_prefix_still_refuses_another_name() -> None:
    full = f"GET /v1/AUTH_t/c/{quote('résumé')} HTTP/1.1\r\n".encode()
    assert _joined(full[:23], _swift_logged("/v1/AUTH_t/c/xr")) is None  # r%C3%A -> "r": still a prefix to match
    assert _joined(full[:26], _swift_logged("/v1/AUTH_t/c/rèsumé")) is None  # "ré" is not "rè"


def test_the_tcp_peer_is_remote_addr_not_x_forwarded_for() -> None:
    head = b"GET /v1/AUTH_t/c/o HTTP/1.1\r\n\r\n"
    assert _joined(head, "/v1/AUTH_t/c/o", client="198.51.100.7") == "txabc-0001"
    assert _joined(head, "/v1/AUTH_t/c/o", client="2001:db8::1") == "txabc-0001"  # IPv6 XFF: the line is kept
    assert _joined(head, "/v1/AUTH_t/c/o", client="10.0.0.10", remote="10.0.0.99") is None  # another peer
    p = parse_line("proxy-server: " + PROXY_MSG.replace("10.200.14.10 10.200.14.10", "2001:db8::1 10.200.14.11", 1))
    assert p is not None and p.remote == ip_int("10.200.14.11")


def test_dual_stack_v4_mapped_addresses_are_ipv4() -> None:
    p = parse_line("proxy-server: " + PROXY_MSG.replace("10.200.14.10 10.200.14.10",
                                                        "::ffff:10.200.14.10 ::FFFF:10.200.14.10", 1))
    assert p is not None and p.remote == ip_int("10.200.14.10")
    o = parse_line("object-server: " + OBJECT_MSG.replace("10.200.14.20 - -", "::ffff:10.200.14.20 - -"))
    assert o is not None and o.remote == ip_int("10.200.14.20")
    assert parse_line("object-server: " + OBJECT_MSG.replace("10.200.14.20 - -", "fd00::20 - -")) is None
