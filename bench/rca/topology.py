"""The simulated shop: which service calls which, on what path, and how much work each does.

The call structure is Sock Shop's (weaveworks/microservices-demo): the front-end calls
catalogue, carts, orders and user; orders reads the customer from user and the cart from
carts, authorises the payment, books the shipping and stores the order; carts, catalogue,
user and orders keep their data in their own database service. Work per request is small
(a millisecond or so of CPU, a little memory, databases a little disk I/O) so that the whole
mesh stays light on a shared 2-core machine and an injected fault stands out.
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "sock-shop"
SERVICE_PORT = 80  # the port Istio's cluster names carry (the process listens on a free port)


@dataclass(frozen=True)
class Call:
    """One downstream call an endpoint makes; ``{cid}`` / ``{item}`` come from the request."""

    service: str
    method: str
    path: str


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # aiohttp route pattern
    calls: tuple[Call, ...] = ()
    cpu_ms: float = 0.5  # hashing work per request
    alloc_kb: int = 16  # short-lived memory per request
    disk: str | None = None  # "read" | "write": a small file read / an appended record + fsync


@dataclass(frozen=True)
class Service:
    name: str
    endpoints: tuple[Endpoint, ...]
    log_format: str = "istio_text"  # how its sidecar writes: istio_text | istio_json
    database: bool = False

    def dependencies(self) -> list[str]:
        return sorted({c.service for e in self.endpoints for c in e.calls})


def _svc(name: str, *endpoints: Endpoint, log_format: str = "istio_text", database: bool = False) -> Service:
    return Service(name, tuple(endpoints), log_format, database)


C = Call
E = Endpoint

SERVICES: dict[str, Service] = {s.name: s for s in [
    _svc("front-end",
         E("GET", "/", (C("catalogue", "GET", "/catalogue"),), cpu_ms=0.5),
         E("GET", "/catalogue", (C("catalogue", "GET", "/catalogue"),), cpu_ms=0.5),
         E("GET", "/detail/{item}", (C("catalogue", "GET", "/catalogue/{item}"),), cpu_ms=0.3),
         E("POST", "/login/{cid}", (C("user", "GET", "/login/{cid}"),), cpu_ms=0.3),
         E("GET", "/cart/{cid}", (C("carts", "GET", "/carts/{cid}/items"),), cpu_ms=0.3),
         E("POST", "/cart/{cid}/{item}", (C("catalogue", "GET", "/catalogue/{item}"),
                                          C("carts", "POST", "/carts/{cid}/items/{item}")), cpu_ms=0.3),
         E("DELETE", "/cart/{cid}/{item}", (C("carts", "DELETE", "/carts/{cid}/items/{item}"),), cpu_ms=0.3),
         E("POST", "/orders/{cid}", (C("orders", "POST", "/orders/{cid}"),), cpu_ms=0.3)),
    _svc("catalogue",
         E("GET", "/catalogue", (C("catalogue-db", "GET", "/socks"),), cpu_ms=0.8),
         E("GET", "/catalogue/{item}", (C("catalogue-db", "GET", "/socks/{item}"),), cpu_ms=0.4)),
    _svc("carts",
         E("GET", "/carts/{cid}/items", (C("carts-db", "GET", "/carts/{cid}"),), cpu_ms=0.6, alloc_kb=32),
         E("POST", "/carts/{cid}/items/{item}", (C("carts-db", "POST", "/carts/{cid}/{item}"),), cpu_ms=0.6),
         E("DELETE", "/carts/{cid}/items/{item}", (C("carts-db", "DELETE", "/carts/{cid}/{item}"),), cpu_ms=0.6),
         log_format="istio_json"),
    _svc("orders",
         E("POST", "/orders/{cid}", (
             C("user", "GET", "/customers/{cid}"),
             C("carts", "GET", "/carts/{cid}/items"),
             C("payment", "POST", "/paymentAuth"),
             C("shipping", "POST", "/shipping"),
             C("orders-db", "POST", "/orders/{cid}"),
         ), cpu_ms=1.0, alloc_kb=64),
         log_format="istio_json"),
    _svc("user",
         E("GET", "/login/{cid}", (C("user-db", "GET", "/customers/{cid}"),), cpu_ms=1.0),
         E("GET", "/customers/{cid}", (C("user-db", "GET", "/customers/{cid}"),), cpu_ms=0.4)),
    _svc("payment", E("POST", "/paymentAuth", cpu_ms=0.5)),
    _svc("shipping", E("POST", "/shipping", cpu_ms=0.5)),
    # The cart database does the most work per request (Sock Shop's carts-db is a MongoDB).
    _svc("carts-db",
         E("GET", "/carts/{cid}", cpu_ms=2.5, disk="read"),
         E("POST", "/carts/{cid}/{item}", cpu_ms=2.5, disk="write"),
         E("DELETE", "/carts/{cid}/{item}", cpu_ms=2.5, disk="write"),
         database=True),
    _svc("catalogue-db",
         E("GET", "/socks", cpu_ms=0.6, disk="read"),
         E("GET", "/socks/{item}", cpu_ms=0.3, disk="read"),
         database=True),
    _svc("user-db", E("GET", "/customers/{cid}", cpu_ms=0.3, disk="read"), database=True),
    _svc("orders-db", E("POST", "/orders/{cid}", cpu_ms=0.5, disk="write"), database=True),
]}

# The services the issue names; the three other databases complete Sock Shop's call structure.
CORE_SERVICES = ("front-end", "orders", "carts", "carts-db", "catalogue", "user", "payment", "shipping")


def edges() -> set[tuple[str, str]]:
    """caller -> callee for the whole topology."""
    return {(s.name, d) for s in SERVICES.values() for d in s.dependencies()}


def callers_of(service: str) -> list[str]:
    return sorted(a for a, b in edges() if b == service)
