"""Swift access logs as the source of transaction ids when the captures lack the headers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from exporters.swift.analyze import analyze
from exporters.swift.pcap import ip_int
from exporters.swift.roles import RoleMap
from exporters.swift.swiftlogs import parse_line, read_logs
from exporters.swift.synth import NODES, SynthNet, roles_mapping, swift_put

PROXY_LINE = ("proxy: 10.200.14.10 10.200.14.10 23/Nov/2026/15/42/24 PUT /v1/AUTH_test/c%20x/o HTTP/1.0 201 - "
              "python-swiftclient-4.11.0 AUTH_tk8b... - - - tx9a1b05be7868420ea7d7d-006b045ee0 - 0.0251 - - "
              "1795448544.470043421 1795448544.495098591 0")
SUBREQUEST = ("proxy: - - 23/Nov/2026/15/42/24 HEAD /v1/AUTH_test/c%3Fformat%3Djson HTTP/1.0 204 - Swift - - - - "
              "tx366c019b316e4c88aa343-006b045ee0 - 0.0025 VW - 1795448544.497128010 1795448544.499649525 0")
OBJECT_LINE = ('object-s1: 10.200.14.20 - - [23/Nov/2026:15:42:24 +0000] "PUT /d1/822/AUTH_test/c/o" 201 - '
               '"PUT http://10.200.14.20:8080/v1/AUTH_test/c/o" "tx366c019b316e4c88aa343-006b045ee0" '
               '"proxy-server 29535" 0.0078 "-" 29537 0')


def test_parse_proxy_storage_and_skip_the_rest() -> None:
    p = parse_line(PROXY_LINE)
    assert p and p.remote == ip_int("10.200.14.10") and p.method == "PUT" and p.path == "/v1/AUTH_test/c x/o"
    assert p.trans_id.startswith("tx9a1b") and p.precise and abs(p.start - 1795448544.470043421) < 1e-6
    o = parse_line(OBJECT_LINE)
    assert o and o.remote == ip_int("10.200.14.20") and o.path == "/d1/822/AUTH_test/c/o" and not o.precise
    assert abs(o.start - (1795448544.0 - 0.0078)) < 1e-6
    assert parse_line(SUBREQUEST) is None
    assert parse_line("object-s1: STDERR: something went wrong") is None
    assert parse_line("proxy: 10.0.0.1 garbage") is None


def synthetic_puts(tmp_path: Path) -> tuple[dict[str, Path], RoleMap, list[str], list[str], Any]:
    """Three PUTs captured without X-Trans-Id, the proxy's access messages for them (no tag)
    and the analysis without logs."""
    net = SynthNet(dict(NODES))
    t = 1_795_448_405_000_000_000
    txs = []
    for i in range(3):
        txs.append(f"tx{i:021x}-0000000000")
        t = swift_put(net, t, txs[-1], with_trans_id=False) + 50_000_000
    roles = RoleMap()
    roles.add_mapping_dict(roles_mapping())
    paths = net.write(tmp_path)
    before = analyze(paths, roles)
    served = sorted((x for x in before.exchanges if x.side == "server" and x.server_role == "proxy"),
                    key=lambda x: x.req_start)
    msgs = []
    for x, tx in zip(served, txs):
        day = time.strftime("%d/%b/%Y/%H/%M/%S", time.gmtime(x.req_start / 1e9))
        msgs.append(f"{NODES['client']} {NODES['client']} {day} PUT /v1/AUTH_test/c/o HTTP/1.0 201 - ua - - - - "
                    f"{tx} - 0.01 - - {x.req_start / 1e9:.9f} {x.resp_end / 1e9:.9f} 0")
    return paths, roles, txs, msgs, before


def test_logs_give_the_joins_their_transaction_ids(tmp_path: Path) -> None:
    paths, roles, txs, msgs, before = synthetic_puts(tmp_path)
    assert before.joins.trans_id == 0 and before.joins.timing == 9
    # The proxy's access log for the three client PUTs (start times from the proxy's capture).
    lines = [f"proxy: {m}" for m in msgs]
    log = tmp_path / "proxy-server.log"
    log.write_text("\n".join(lines) + "\nproxy: STDERR: noise\n")
    entries, skipped = read_logs([log])
    assert len(entries) == 3 and skipped == 1
    after = analyze(paths, roles, logs=[log])
    assert after.trans_ids_from_logs == 6  # the proxy's view, and the client's of the same exchange
    assert after.joins.trans_id == 0  # the calls to storage have no id (no storage log given)
    assert {x.trans_id for x in after.exchanges if x.side == "server" and x.server_role == "proxy"} == set(txs)


def test_a_line_without_end_is_skipped_in_bounded_pieces(tmp_path) -> None:
    """`--swift-log /dev/zero` (or a binary file) was read as one endless line into memory: a
    line past MAX_LINE is skipped (counted) and the lines after it are read."""
    from exporters.swift.swiftlogs import MAX_LINE, read_logs

    log = tmp_path / "proxy.log"
    log.write_text(PROXY_LINE.rstrip("\n") + "\n" + "x" * (3 * MAX_LINE + 7) + "\n" + PROXY_LINE.rstrip("\n") + "\n")
    got, skipped = read_logs([log])
    assert len(got) == 2 and skipped == 1


def test_swift_log_and_capture_mistakes_are_one_line(tmp_path, capsys) -> None:
    from exporters.swift.cli import main
    from exporters.swift.synth import tcp_packet, write_pcap

    cap = tmp_path / "c.pcap"
    write_pcap(cap, [(1_795_448_405_000_000_000, tcp_packet("10.0.0.1", "10.0.0.2", 40000, 8080, 1, 0, 0x18, b"x"))])
    assert main(["analyze", f"--capture=client={cap}", f"--capture=proxy={cap}"]) == 1
    assert "the same file as node client's" in capsys.readouterr().err
    assert main(["analyze", f"--capture=client={cap}", f"--swift-log={tmp_path / 'nope.log'}"]) == 1
    err = capsys.readouterr().err
    assert "--swift-log" in err and "no such file" in err and err.count("\n") == 1
