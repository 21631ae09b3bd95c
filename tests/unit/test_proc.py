"""Port plumbing: callers picking many ports before binding any get distinct ones."""

from __future__ import annotations

from promreflex.proc import free_port, port_in_use


def test_free_port_never_hands_out_the_same_port_twice_in_a_row() -> None:
    # 400 picks from the ~28 000 ephemeral ports: without the guard the kernel repeats one
    # with probability ~94 % (birthday bound), the way a 33-process mesh once collided.
    ports = [free_port() for _ in range(400)]
    assert len(set(ports)) == len(ports)
    assert not any(port_in_use("127.0.0.1", p) for p in ports[:20])
