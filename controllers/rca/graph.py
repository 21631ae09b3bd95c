"""Where slowness stops: the graph half of the decision.

A slow service whose callee is slow too may only be waiting for it (the paper's orders ->
carts). Following slow callees from slow callers ends either at a service with no slow callee
(a root-cause candidate) or in a cycle of slow services calling each other. A cycle with no
slow callee outside itself is a root of its own: each member is a candidate, since the data
cannot say which one started it. Strongly connected components handle both cases at once
and make cycles terminate by construction.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


def adjacency(edges: Iterable[tuple[str, str]], nodes: Iterable[str] = ()) -> dict[str, list[str]]:
    """caller -> sorted callees, self-calls dropped (a service waiting on itself explains
    nothing), every node present even without edges."""
    adj: dict[str, set[str]] = {n: set() for n in nodes}
    for a, b in edges:
        adj.setdefault(a, set())
        adj.setdefault(b, set())
        if a != b:
            adj[a].add(b)
    return {n: sorted(cs) for n, cs in sorted(adj.items())}


def strongly_connected_components(adj: dict[str, list[str]]) -> list[frozenset[str]]:
    """Tarjan's algorithm without recursion (deep call chains must not hit Python's limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[frozenset[str]] = []
    counter = 0
    for root in adj:
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            callees = adj.get(node, [])
            if i < len(callees):
                work.append((node, i + 1))
                nxt = callees[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                comp = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.add(member)
                    if member == node:
                        break
                out.append(frozenset(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return out


def slow_subgraph(adj: dict[str, list[str]], slow: set[str]) -> dict[str, list[str]]:
    return {n: [c for c in adj.get(n, []) if c in slow] for n in sorted(slow)}


def root_components(slow_adj: dict[str, list[str]]) -> tuple[dict[str, frozenset[str]], set[str]]:
    """(component of every slow service, the slow services in components with no slow callee
    outside themselves)."""
    comp_of: dict[str, frozenset[str]] = {}
    for comp in strongly_connected_components(slow_adj):
        for n in comp:
            comp_of[n] = comp
    roots = {
        n for n, comp in comp_of.items()
        if all(c in comp for m in comp for c in slow_adj[m])
    }
    return comp_of, roots


def path_to_root(start: str, slow_adj: dict[str, list[str]], roots: set[str]) -> list[str]:
    """Shortest chain of slow calls from ``start`` to a root-cause candidate (breadth first, so
    cycles are visited once)."""
    prev: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node in roots:
            chain = [node]
            while (p := prev[chain[-1]]) is not None:
                chain.append(p)
            return chain[::-1]
        for nxt in slow_adj.get(node, []):
            if nxt not in prev:
                prev[nxt] = node
                queue.append(nxt)
    return [start]
