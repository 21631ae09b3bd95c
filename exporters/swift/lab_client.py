"""A Swift client the lab runs *inside* its client namespace (``ip netns exec ... python -m
exporters.swift.lab_client``): a verified round trip (PUT then GET, content compared by MD5) of
one object per size. Prints one JSON line; exits 1 when any round trip failed.

``python -m exporters.swift.lab_client --auth URL --user U --key K roundtrip --sizes 1,1024,1048576``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Any

from swiftclient.client import Connection
from swiftclient.exceptions import ClientException


def roundtrip(conn: Connection, container: str, sizes: list[int], repeat: int = 1) -> dict[str, Any]:
    conn.put_container(container)
    results = []
    ok = True
    for size in sizes:
        for i in range(repeat):
            body = os.urandom(size)
            name = f"obj-{size}-{i}-{time.time_ns()}"
            t0 = time.perf_counter()
            put_resp: dict[str, Any] = {}
            etag = conn.put_object(container, name, body, content_length=size, response_dict=put_resp)
            t1 = time.perf_counter()
            headers, got = conn.get_object(container, name)
            t2 = time.perf_counter()
            good = got == body and etag == hashlib.md5(body).hexdigest()  # noqa: S324 - Swift's ETag is MD5
            ok &= good
            results.append({"size": size, "name": name, "ok": good, "put_s": round(t1 - t0, 6),
                            "get_s": round(t2 - t1, 6),
                            "put_trans_id": put_resp.get("headers", {}).get("x-trans-id", ""),
                            "get_trans_id": headers.get("x-trans-id", "")})
    return {"ok": ok, "container": container, "objects": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exporters.swift.lab_client")
    p.add_argument("--auth", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--key", required=True)
    sub = p.add_subparsers(dest="command", required=True)
    rt = sub.add_parser("roundtrip", help="PUT then GET one object per size, compare contents")
    rt.add_argument("--container", default="lab-verify")
    rt.add_argument("--sizes", default="1,1024", help="comma-separated object sizes in bytes")
    rt.add_argument("--repeat", type=int, default=1, help="objects per size")
    args = p.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        print(json.dumps({"ok": False, "error": f"bad --sizes {args.sizes!r}"}))
        return 1
    conn = Connection(authurl=args.auth, user=args.user, key=args.key, retries=2, timeout=30)
    try:
        result = roundtrip(conn, args.container, sizes, max(1, args.repeat))
    except (ClientException, OSError) as e:
        result = {"ok": False, "error": str(e).splitlines()[0] if str(e) else type(e).__name__}
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
