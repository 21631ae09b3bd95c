"""Joining calls to the request they serve (exporters/swift/exchanges.py ``join``), on exchanges
built by hand: what a stranger's real Swift cluster showed (a hung replica, services of one node
sharing a transaction id, a snap length that cut X-Trans-Id under concurrency)."""

from __future__ import annotations

from exporters.swift.analyze import ambiguity_note
from exporters.swift.exchanges import Exchange, join

MS = 1_000_000
PROXY, S2, S3 = 1, 2, 3


def server(node: int, role: str, t0: float, t1: float, tx: str | None = None, caller: str = "proxy") -> Exchange:
    """A request the node answers: in at t0 (ms), answered at t1."""
    return Exchange(node=node, side="server", client=(100, 40000), server=(node, 6000), server_role=role,
                    client_role=caller, req_start=int(t0 * MS), req_end=int(t0 * MS), resp_start=int(t1 * MS),
                    resp_end=int(t1 * MS) + 1000, trans_id=tx)


def call(node: int, caller: str, role: str, t0: float, t1: float, tx: str | None = None) -> Exchange:
    """A call the node makes: out at t0 (ms), its answer in at t1."""
    return Exchange(node=node, side="client", client=(node, 50000), server=(9, 6000), server_role=role,
                    client_role=caller, req_start=int(t0 * MS), req_end=int(t0 * MS), resp_start=int(t1 * MS) - 1000,
                    resp_end=int(t1 * MS), trans_id=tx)


def test_a_call_cut_off_by_the_callers_timeout_is_fan_out_not_processing():
    # Swift's proxy waits node_timeout (10 s) for a hung object server, then answers from another
    # replica; the hung one answers after SIGCONT, into the closed connection. Before: the call
    # was an orphan and the proxy's 10 s wait its own processing (SwiftNodeSlow on the proxy).
    ex = [server(PROXY, "proxy", 0, 10_010, tx="txG"),
          call(PROXY, "proxy", "object", 2, 20_000, tx="txG"),  # the hung replica, answered long after
          call(PROXY, "proxy", "object", 10_002, 10_008, tx="txG")]  # the next replica, after the timeout
    counts = join(ex)
    assert counts.orphan == 0 and counts.late == 1 and counts.trans_id == 2
    assert ex[1].parent == 0 and ex[1].late and not ex[2].late and ex[1].until == 10_010 * MS
    # the union of both calls, the hung one clipped to the request's answer: 2 ms -> 10,010 ms
    assert ex[0].fanout_wait == 10_008 * MS
    assert ex[0].processing == 2 * MS


def test_a_call_from_a_storage_node_goes_to_the_service_that_can_make_it():
    # s2 serves the proxy's container PUT (its container server updates an account) and, at the
    # same time, s3's account update (its account server calls no one). One transaction id for
    # all. Before: the latest started (the account server's) was charged with the call.
    ex = [server(S2, "container", 0, 40, tx="tx1"),
          server(S2, "account", 12, 36, tx="tx1", caller="storage"),
          call(S2, "storage", "account", 19, 34, tx="tx1")]
    counts = join(ex)
    assert ex[2].parent == 0 and counts.ambiguous == 0
    assert ex[1].fanout_wait == 0 and ex[1].processing == 24 * MS
    assert ex[0].fanout_wait == 15 * MS and ex[0].processing == 25 * MS


def test_an_ambiguous_call_is_charged_to_no_request_and_theirs_are_not_guessed():
    # Two client requests open at the proxy, transaction ids cut by the snap length: the call
    # could serve either. Before: the latest started got it (213 of 282 calls wrong at 6 clients).
    ex = [server(PROXY, "proxy", 0, 50), server(PROXY, "proxy", 5, 60), server(PROXY, "proxy", 100, 130),
          call(PROXY, "proxy", "object", 10, 40), call(PROXY, "proxy", "object", 105, 125)]
    counts = join(ex)
    assert counts.ambiguous == 1 and counts.timing == 1 and counts.uncertain == 2
    assert ex[3].parent is None and ex[3].join == "ambiguous"
    assert ex[0].processing is None and ex[1].processing is None  # not measured rather than wrong
    assert ex[2].processing == 10 * MS and ex[4].parent == 2
    note = ambiguity_note(counts, ex)
    assert note is not None and "2 of 2 calls carry no X-Trans-Id" in note and "-s 0" in note


def test_a_late_answer_needs_its_id_and_an_id_that_is_none_of_theirs_joins_none():
    # Without its X-Trans-Id a call answered after every open request is an orphan, not charged
    # by timing to a request that merely was open when it started (a capture that ended before
    # its own request's answer gave R1 a fan-out it never had). A call whose id is none of the
    # open requests' (an object updater replaying an old update) is an orphan too: before, it
    # made both object requests "uncertain".
    ex = [server(PROXY, "proxy", 0, 100, tx="tx1"), call(PROXY, "proxy", "object", 60, 200)]
    counts = join(ex)
    assert counts.orphan == 1 and ex[1].parent is None and ex[0].processing == 100 * MS
    ex = [server(S2, "object", 0, 50, tx="txA"), server(S2, "object", 5, 60, tx="txB"),
          call(S2, "storage", "container", 20, 40, tx="txOLD")]
    counts = join(ex)
    assert counts.orphan == 1 and counts.ambiguous == 0 and counts.uncertain == 0
    assert ex[0].processing == 50 * MS and ex[1].processing == 55 * MS


def test_several_requests_with_the_calls_id_on_one_node_are_not_guessed():
    # Replicas of one PUT on devices of one machine (SAIO, fewer nodes than replicas): three object
    # servers of s1 hold txA, each sends its container update with it. The second round picked
    # the latest started: 22 and 42 ms of "processing" for 2.2 ms ones, as trans_id joins.
    ex = [server(S2, "object", 0, 22.3, tx="txA"), server(S2, "object", 0.1, 42.3, tx="txA"),
          server(S2, "object", 0.2, 62.3, tx="txA"),
          call(S2, "storage", "container", 2, 22, tx="txA"), call(S2, "storage", "container", 2.1, 42, tx="txA"),
          call(S2, "storage", "container", 2.2, 62, tx="txA")]
    counts = join(ex)
    assert counts.trans_id == 1 and counts.ambiguous == 2 and counts.uncertain == 3  # the last: one candidate
    assert all(x.processing is None for x in ex[:3])
