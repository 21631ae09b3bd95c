"""Turn a parsed access-log record into bounded label values: the edge, code class and flags.

Label values come only from small sets: mesh service names (DNS labels, at most
``max_services`` distinct ones), a few reserved words, status classes and Envoy's documented
response flags. Paths, IPs, request ids and arbitrary hostnames never become label values,
because every distinct value is a new series in Prometheus.

Edge derivation, for a record written by workload ``W``'s sidecar:

* ``upstream_cluster`` ``outbound|PORT|SUBSET|HOST``: the request left ``W`` for the service
  in ``HOST`` (``carts.sock-shop.svc.cluster.local`` -> ``carts``): edge ``W -> carts``.
* ``inbound|PORT|...``: the request arrived at ``W``; the caller is not in Istio's default
  format, so the source is the caller's SPIFFE service account when the format logs
  ``%DOWNSTREAM_PEER_URI_SAN%``, else ``unknown``: edge ``unknown -> W``.
* ``inbound-vip|PORT|http|HOST`` (an Istio ambient *waypoint*): the request was for the service
  in ``HOST``; the waypoint is not the caller, so the source is the caller's service account
  when logged, else ``unknown``: edge ``unknown -> reviews``.
* ``PassthroughCluster`` / ``BlackHoleCluster``: ``W -> external`` / ``W -> blackhole``.
* Consul Connect: ``local_app`` is inbound (``unknown -> W``); ``<service>.<ns>.<dc>.internal.<domain>.consul``
  is outbound (``W -> service``).
* otherwise (``-``, no route): the ``authority`` (``carts:80``, ``carts.sock-shop.svc.cluster.local``).

A host that is not a mesh service (an FQDN outside ``*.svc*``, unless it is ``<name>.<configured
namespace>``) is ``external``; an IP literal, ``localhost`` or nothing is ``unknown``. In
``<a>.<b>.<ns>.svc...`` the service is ``<b>``: ``<a>`` is a pod (a StatefulSet's ``es-master-0``,
a pod IP written ``10-244-1-5``). The service account ``default`` names no caller (``unknown``).
A caller named only by its account is that account's name: a workload run under an account of
another name (Bookinfo's ``bookinfo-productpage``) is then a node of its own on the callee's side;
matching accounts to workloads by prefix or suffix merged distinct services (``shop-api`` into
``api``) and was left out.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

UNKNOWN = "unknown"
EXTERNAL = "external"
BLACKHOLE = "blackhole"
OTHER = "other"
NONE = "none"
RESERVED = frozenset({UNKNOWN, EXTERNAL, BLACKHOLE, OTHER})

_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_SPIFFE_SA = re.compile(r"spiffe://[^/]+/ns/[^/]+/sa/([^/]+)")

# Envoy's short response flags (source/common/stream_info/utility.h) and their long names.
RESPONSE_FLAGS_LONG: dict[str, str] = {
    "DC": "DownstreamConnectionTermination",
    "LH": "FailedLocalHealthCheck",
    "UH": "NoHealthyUpstream",
    "UT": "UpstreamRequestTimeout",
    "LR": "LocalReset",
    "UR": "UpstreamRemoteReset",
    "UF": "UpstreamConnectionFailure",
    "UC": "UpstreamConnectionTermination",
    "UO": "UpstreamOverflow",
    "URX": "UpstreamRetryLimitExceeded",
    "NR": "NoRouteFound",
    "DI": "DelayInjected",
    "FI": "FaultInjected",
    "RL": "RateLimited",
    "UAEX": "UnauthorizedExternalService",
    "RLSE": "RateLimitServiceError",
    "SI": "StreamIdleTimeout",
    "IH": "InvalidEnvoyRequestHeaders",
    "DPE": "DownstreamProtocolError",
    "UMSDR": "UpstreamMaxStreamDurationReached",
    "RFCF": "ResponseFromCacheFilter",
    "NFCF": "NoFilterConfigFound",
    "DT": "DurationTimeout",
    "UPE": "UpstreamProtocolError",
    "NC": "NoClusterFound",
    "OM": "OverloadManagerTerminated",
    "DF": "DnsResolutionFailed",
    "DO": "DropOverload",
    "DR": "DownstreamRemoteReset",
}
KNOWN_FLAGS = frozenset(RESPONSE_FLAGS_LONG)
_LONG_TO_SHORT = {v: k for k, v in RESPONSE_FLAGS_LONG.items()}
MAX_FLAGS_IN_LABEL = 2

# gRPC status names as Envoy's %GRPC_STATUS% writes them, by number.
GRPC_STATUS_NAMES = (
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
)
# Looked up lower-cased without underscores: Envoy's %GRPC_STATUS% writes ``NotFound`` (CAMEL_STRING),
# ``NOT_FOUND`` with ``(SNAKE_STRING)``, and gRPC's own spelling is ``CANCELLED``.
_GRPC_BY_LOWER = {n.lower(): n for n in GRPC_STATUS_NAMES} | {"cancelled": "Canceled"}


def flags_label(flags: Iterable[str] | None) -> str:
    """Bounded label for a record's response flags.

    ``-``/none -> ``none``; known flags (short or long names) sorted and joined with ``,``
    (``URX,UF`` and ``UF,URX`` are one series); an unknown flag, or more than
    :data:`MAX_FLAGS_IN_LABEL` flags at once, -> ``other``. So the value set is ``none``,
    ``other``, each flag and each pair: bounded, and in practice a handful.
    """
    if not flags:
        return NONE
    short = set()
    for f in flags:
        f = _LONG_TO_SHORT.get(f, f)
        if f not in KNOWN_FLAGS:
            return OTHER
        short.add(f)
    if len(short) > MAX_FLAGS_IN_LABEL:
        return OTHER
    return ",".join(sorted(short))


# The HTTP status each gRPC status stands for (google/rpc/code.proto documents the mapping):
# a gRPC call that failed is answered with HTTP 200 and a grpc-status trailer, so the class of
# its outcome is the class of this code, not of the 200.
GRPC_HTTP_EQUIVALENT: dict[str, int] = {
    "OK": 200, "Canceled": 499, "Unknown": 500, "InvalidArgument": 400, "DeadlineExceeded": 504,
    "NotFound": 404, "AlreadyExists": 409, "PermissionDenied": 403, "ResourceExhausted": 429,
    "FailedPrecondition": 400, "Aborted": 409, "OutOfRange": 400, "Unimplemented": 501,
    "Internal": 500, "Unavailable": 503, "DataLoss": 500, "Unauthenticated": 401,
}
L4 = "tcp"  # code class of a TCP connection that closed without error (ztunnel, sidecar TCP): no HTTP status


# Response flags with which Envoy reports that a proxied TCP connection failed: the upstream
# was never reached (no route, no healthy host, connect failure or timeout, circuit breaker,
# retries exhausted, DNS, overload) or the connection was refused (rate limit, ext_authz/RBAC).
# The flags a healthy connection may end with (DC, UC, SI, DT, LR, DR...: one side closed it,
# an idle or duration timeout) are not failures of a TCP connection.
TCP_FAILURE_FLAGS = frozenset(
    {"UF", "UH", "UO", "URX", "NR", "NC", "UT", "UPE", "DF", "DO", "OM", "LH", "RL", "RLSE", "UAEX", "NFCF"}
)


# What Envoy answers itself when a flag says it could not get an answer from upstream: for a
# gRPC call that answer is HTTP 200 with a grpc-status (14 Unavailable for no healthy upstream,
# a failed connection, an overflow), so ``200 UH`` is logged. In a format that does not log the
# gRPC status (Istio's default text and JSON), the flag is all that tells the failure apart.
LOCAL_REPLY_CODE: dict[str, int] = {
    "UH": 503, "UF": 503, "UO": 503, "URX": 503, "UPE": 503, "DF": 503, "DO": 503, "OM": 503, "LH": 503,
    "NC": 503, "NFCF": 500, "RLSE": 500, "UT": 504, "NR": 404, "RL": 429, "UAEX": 403,
}


def _absent(value: Any) -> bool:
    return value is None or value in ("", "-")


def is_tcp_record(record: Mapping[str, Any], grpc_status: str | None = None) -> bool:
    """True for a sidecar/Envoy record of a proxied TCP connection, not an HTTP request.

    Envoy writes such a record as ``"- - -" 0 ...`` (Istio text), ``"response_code": 0`` with
    no method and protocol (JSON), or ``-``/0 for ``%RESPONSE_CODE%``: RESPONSE_CODE is not
    set for TCP, and DURATION is the downstream connection's lifetime. So: a response code of
    0 or none, and neither a method nor a protocol (nor a gRPC status) logged. An HTTP request
    that got no answer (code 0, ``UF``/``DC``...) still has its method and protocol. A format
    that logs neither cannot tell the two apart; its code-0 records are taken as connections
    (a failure flag still counts them as errors, see :func:`tcp_class`)."""
    code = record.get("response_code")
    if code not in (0, None) or isinstance(code, bool) or grpc_status is not None:
        return False
    return _absent(record.get("method")) and _absent(record.get("protocol"))


def _short_flags(flags: Iterable[str] | None) -> list[str]:
    if isinstance(flags, str):
        flags = (flags,)
    return [_LONG_TO_SHORT.get(f, f) for f in flags or () if isinstance(f, str)]


def tcp_failed(flags: Iterable[str] | None, termination: Any = None) -> bool:
    """Whether a TCP record says the connection failed: a flag of :data:`TCP_FAILURE_FLAGS`, or
    the RBAC filter's refusal, which sets no flag, only ``%CONNECTION_TERMINATION_DETAILS%``
    ``rbac_access_denied_matched_policy[...]`` (an ext_authz refusal is the flag ``UAEX``)."""
    if isinstance(termination, str) and termination.startswith("rbac_access_denied"):
        return True
    return any(f in TCP_FAILURE_FLAGS for f in _short_flags(flags))


def tcp_class(failed: bool) -> str:
    """Code class of a TCP connection (a ztunnel ``l4`` record or a sidecar's TCP record):
    ``none`` (counted as an error, like an HTTP request that got no answer) when it failed,
    else ``tcp``."""
    return NONE if failed else L4


def code_class(code: int | None, grpc_status: str | None = None, flags: Iterable[str] | None = None) -> str:
    """``2xx`` .. ``5xx``; ``none`` for 0 or missing (Envoy logs 0 when no response was sent).

    For an HTTP request only: a TCP connection's class is :func:`tcp_class` (the collector
    tells them apart with :func:`is_tcp_record`).

    A 2xx answer carrying a gRPC status other than OK takes the class of the status' HTTP
    equivalent (``Unavailable`` -> ``5xx``), so a gRPC failure is a failure. With no gRPC status
    logged, a 2xx with a flag of Envoy's own failed answer (``200 UH``: :data:`LOCAL_REPLY_CODE`)
    takes that answer's class."""
    if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
        return OTHER  # (a record's code is an int or None; anything else is junk, not a crash)
    if code and 200 <= code <= 299 and grpc_status not in (None, "OK"):
        equivalent = GRPC_HTTP_EQUIVALENT.get(grpc_status, 500)
        return f"{equivalent // 100}xx"
    if code and 200 <= code <= 299 and grpc_status is None:
        local = [LOCAL_REPLY_CODE[f] for f in _short_flags(flags) if f in LOCAL_REPLY_CODE]
        if local:
            return f"{max(local) // 100}xx"
    if not code:
        return NONE
    if 100 <= code <= 599:
        return f"{code // 100}xx"
    return OTHER


def grpc_status_label(status: Any) -> str | None:
    """Canonical gRPC status name, ``other`` for junk, None when the record has none."""
    if status is None or status == "-" or status == "":
        return None
    if isinstance(status, bool):
        return OTHER
    # ASCII digits only: str.isdigit() is also true for "²" or "٣", which int() refuses.
    if isinstance(status, int) or (isinstance(status, str) and status.isascii() and status.isdigit()):
        n = int(status)
        return GRPC_STATUS_NAMES[n] if 0 <= n < len(GRPC_STATUS_NAMES) else OTHER
    return _GRPC_BY_LOWER.get(str(status).lower().replace("_", ""), OTHER)


def service_name(value: Any) -> str | None:
    """``value`` as a label when it is a DNS label (lower-cased); else None."""
    if not isinstance(value, str):
        return None
    v = value.strip().lower()
    return v if _DNS_LABEL.fullmatch(v) else None


def authority_host(authority: Any) -> str | None:
    """Host part of an authority: ``carts:80`` -> ``carts``, ``[::1]:8080`` -> ``::1``."""
    if not isinstance(authority, str) or not authority or authority == "-":
        return None
    a = authority.strip()
    if a.startswith("["):
        end = a.find("]")
        return a[1:end] if end > 0 else None
    if a.count(":") > 1:  # a bare IPv6 address, no port
        return a
    return a.partition(":")[0] or None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def service_of_host(host: str | None, namespaces: frozenset[str] = frozenset()) -> str:
    """Mesh service for a hostname, or ``external`` / ``unknown`` (never the raw host).

    Anything but a string (a JSON number in ``dst_service``, say) is ``unknown``."""
    if not isinstance(host, str) or not host or host == "-":
        return UNKNOWN
    h = host.strip().rstrip(".").lower()
    if _is_ip(h):
        return UNKNOWN
    labels = h.split(".")
    if len(labels) == 1:
        return UNKNOWN if h == "localhost" else service_name(h) or UNKNOWN
    if "svc" in labels[1:]:
        # <service>.<namespace>.svc...; a pod's own name comes before them (a StatefulSet's
        # es-master-0.es-master-headless.logging.svc, a pod IP's 10-244-1-5.reviews.default.svc)
        at = labels.index("svc", 1)
        return service_name(labels[at - 2] if at >= 2 else labels[0]) or UNKNOWN
    if len(labels) == 2 and labels[1] in namespaces:
        return service_name(labels[0]) or UNKNOWN
    return EXTERNAL


def peer_service_account(san: Any) -> str | None:
    """Service account from a SPIFFE id (``spiffe://cluster.local/ns/x/sa/sleep`` -> ``sleep``)."""
    if not isinstance(san, str):
        return None
    m = _SPIFFE_SA.match(san)
    # A namespace's ``default`` account runs every pod that names none: it identifies no caller.
    return service_name(m.group(1)) if m and m.group(1) != "default" else None


def derive_edge(
    record: Mapping[str, Any], workload: str, namespaces: frozenset[str] = frozenset()
) -> tuple[str, str]:
    """``(source, destination)`` for a record written by ``workload``'s sidecar (or, for an
    ``l4`` record, by a ztunnel: see :mod:`exporters.mesh.ztunnel_format`)."""
    if record.get("l4"):
        return _l4_edge(record, namespaces)
    cluster = record.get("upstream_cluster")
    if isinstance(cluster, str) and cluster not in ("", "-"):
        parts = cluster.split("|")
        if (len(parts) == 4 and parts[0] == "inbound") or cluster.startswith("InboundPassthroughCluster"):
            peer = peer_service_account(record.get("downstream_peer_uri_san"))
            return peer or UNKNOWN, workload
        if len(parts) == 4 and parts[0] == "inbound-vip" and parts[3]:
            peer = peer_service_account(record.get("downstream_peer_uri_san"))
            return peer or UNKNOWN, service_of_host(parts[3], namespaces)
        if len(parts) == 4 and parts[0] == "outbound" and parts[3]:
            return workload, service_of_host(parts[3], namespaces)
        if cluster == "local_app":  # Consul Connect's inbound cluster: the request arrived at W
            return peer_service_account(record.get("downstream_peer_uri_san")) or UNKNOWN, workload
        if cluster.endswith(".consul"):
            return workload, _consul_service(cluster)
        if cluster == "PassthroughCluster":
            return workload, EXTERNAL
        if cluster == "BlackHoleCluster":
            return workload, BLACKHOLE
    return workload, service_of_host(authority_host(record.get("authority")), namespaces)


def _consul_service(cluster: str) -> str:
    """The service of a Consul Connect upstream cluster, read from the end as Consul writes it:
    ``[<subset>.]<service>.<namespace>.<dc>.internal.<trust domain>.consul``; with a partition
    ``...<service>.<namespace>.<partition>.<dc>.internal-v1.<td>.consul``; a peered upstream
    ``...<service>.<namespace>.<partition>.<peer>.external.<td>.consul``. From the end: a service
    named ``internal-api`` is a service (read from the start, it was taken for the marker)."""
    labels = cluster.split(".")
    at = len(labels) - 3
    before = {"internal": 3, "internal-v1": 4, "external": 4}.get(labels[at]) if at >= 0 else None
    if before is None or at < before:
        return UNKNOWN
    return service_name(labels[at - before]) or UNKNOWN


# Kubernetes' generated suffixes use an alphabet without vowels, 0, 1 and 3 (k8s.io/apimachinery
# rand.SafeEncodeString), so "-worker-nq6cw" loses only its pod suffix.
_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
# ReplicaSet hash + pod suffix; a CronJob's Job (its scheduled time in minutes) + pod suffix, so
# each run is not a new service; a DaemonSet's or Job's pod suffix
_POD_HASHES = re.compile(rf"-{_SAFE}{{6,10}}-{_SAFE}{{5}}$|-\d{{6,10}}-{_SAFE}{{5}}$|-{_SAFE}{{5}}$")
_VERSION = re.compile(r"-v\d+$")


def workload_of_pod(pod: Any) -> str | None:
    """The service-like name of a pod: ``productpage-v1-87d54dd59-fn6vw`` -> ``productpage``.

    Drops the ReplicaSet and pod hashes Kubernetes appends (or a DaemonSet/Job pod's suffix),
    then a trailing ``-v<N>``, the version suffix Istio's canonical service convention (and
    every Istio sample) puts on deployment names. None when nothing like a DNS label is left."""
    name = service_name(pod)
    if name is None:
        return None
    name = _POD_HASHES.sub("", name)
    return service_name(_VERSION.sub("", name) or name)


def _l4_edge(record: Mapping[str, Any], namespaces: frozenset[str]) -> tuple[str, str]:
    if record.get("dst_service"):
        dst = service_of_host(record["dst_service"], namespaces)
    elif record.get("dst_workload"):
        dst = workload_of_pod(record["dst_workload"]) or UNKNOWN
    else:
        dst = EXTERNAL if record.get("direction") == "outbound" else UNKNOWN
    # The caller's pod names its workload on both sides (an inbound line names it too: Bookinfo's
    # productpage, whose account is bookinfo-productpage, was two nodes when the callee's ztunnel
    # gave its account); its account only when no pod is named.
    src = workload_of_pod(record.get("src_workload")) or (
        peer_service_account(record.get("src_identity")) if record.get("direction") == "inbound" else None
    ) or UNKNOWN
    return src, dst


class LabelBudget:
    """At most ``limit`` distinct service names; later newcomers become ``other``.

    The guarantee that a misconfigured mesh (or a hostile ``authority`` header) cannot create
    unbounded series, whatever the derivation rules let through. ``on_overflow(label)`` is
    called for every value folded into ``other`` (the exporter counts it per label).
    """

    def __init__(self, limit: int = 200, on_overflow: Callable[[str], None] | None = None):
        self.limit = limit
        self.seen: set[str] = set()
        self.overflowed = 0
        self.on_overflow = on_overflow

    def admit(self, name: str, label: str = "service") -> str:
        if name in RESERVED or name in self.seen:
            return name
        if len(self.seen) >= self.limit:
            self.overflowed += 1
            if self.on_overflow is not None:
                self.on_overflow(label)
            return OTHER
        self.seen.add(name)
        return name


__all__ = [
    "BLACKHOLE",
    "EXTERNAL",
    "GRPC_HTTP_EQUIVALENT",
    "GRPC_STATUS_NAMES",
    "L4",
    "KNOWN_FLAGS",
    "TCP_FAILURE_FLAGS",
    "LabelBudget",
    "NONE",
    "OTHER",
    "RESPONSE_FLAGS_LONG",
    "UNKNOWN",
    "authority_host",
    "code_class",
    "derive_edge",
    "flags_label",
    "grpc_status_label",
    "is_tcp_record",
    "peer_service_account",
    "service_name",
    "service_of_host",
    "tcp_class",
    "tcp_failed",
    "workload_of_pod",
]
