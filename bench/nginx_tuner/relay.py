"""A TCP relay that makes every NEW connection pay an emulated handshake delay.

On loopback a TCP handshake costs tens of microseconds, so "a closed keepalive connection costs
the next request a handshake" cannot show in response times, while for a real visitor it costs
one round trip for TCP plus one (TLS 1.3) or two (TLS 1.2) more. ``tc netem`` is not available
here (STACK-NOTES), so the delay is added in the application: each accepted client connection
waits ``--handshake-ms`` before the relay connects to nginx and starts copying bytes; requests
on an already open connection pass at once. Closes are mirrored both ways, so when nginx's
``keepalive_timeout`` closes its side, the client's connection closes too and its next page
view opens (and pays for) a new one. nginx sees one connection per client connection.

    python -m bench.nginx_tuner.relay --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT --handshake-ms 30
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from promreflex.config import split_host_port


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(listen: str, upstream: str, handshake_s: float, stop: asyncio.Event) -> None:
    uh, up = split_host_port(upstream)

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        await asyncio.sleep(handshake_s)
        try:
            ur, uw = await asyncio.open_connection(uh, up)
        except OSError:
            cw.close()
            return
        await asyncio.gather(_pipe(cr, uw), _pipe(ur, cw))

    host, port = split_host_port(listen)
    server = await asyncio.start_server(handle, host, port, backlog=1024)
    async with server:
        await stop.wait()


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.nginx_tuner.relay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--handshake-ms", type=float, default=30.0)
    args = p.parse_args()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(args.listen, args.upstream, args.handshake_ms / 1000, stop)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
