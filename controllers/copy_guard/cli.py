"""``promreflex copy SRC DST`` (the resumable, pausable, throttleable copier) and ``promreflex
copy-guard adopt|list|resume-all|doctor`` (foreign copies, the registry, and CALIB's check of the
whole chain in ``doctor.py``).

:func:`register` adds both to a CLI's subcommands; each handler returns the exit status.
``--registry.dir`` defaults to :func:`~controllers.copy_guard.registry.default_dir` (absolute, the
same for every command wherever it runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import urllib.request
from pathlib import Path

from promreflex.logs import setup as setup_logging
from controllers.copy_guard import freeze
from controllers.copy_guard.copier import IO_MODES
from controllers.copy_guard.registry import (
    ENV_DIR,
    ID_RE,
    Entry,
    Registry,
    default_dir,
    new_id,
    process_start,
    unwatched,
)
from promreflex.proc import pid_alive

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_MULT = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """``1048576``, ``1M``, ``64KiB``, ``2g`` -> bytes (binary multiples)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 1M, 64K, 1048576)")
    return int(float(m.group(1)) * _MULT[m.group(2).lower()])


REGISTRY_HELP = (f"the copy registry the guard reads (default: ${ENV_DIR}, else /var/lib/promreflex/copies as root, "
                 "else $XDG_STATE_HOME/promreflex/copies; the same wherever the command runs)")


def _abs_path(text: str) -> Path:
    return Path(text).expanduser().absolute()


def _registry(args: argparse.Namespace) -> Path:
    return args.registry_dir if args.registry_dir is not None else default_dir()


def _site(text: str) -> str:
    if not re.match(r"^[a-zA-Z0-9_.-]+$", text):
        raise argparse.ArgumentTypeError("a site is letters, digits, '_', '.', '-'")
    return text


def _warn_unwatched(command: str, directory: Path) -> None:
    """A copy registered where no copy guard looks runs unguarded: said, not refused (a guard
    may start later, or run where this host cannot see it)."""
    why = unwatched(directory)
    if why:
        print(f"{command}: warning: {why}: this copy is registered but nothing guards it until a controller with a "
              f"copy-guard route on this registry starts (the stack's: its route's registry_dir, else the default, "
              f"{default_dir()}; --registry.dir or {ENV_DIR} must name the same directory for both)", file=sys.stderr)


def _copy(args: argparse.Namespace) -> int:
    from controllers.copy_guard.service import run_copy

    setup_logging(args.log_level)
    if args.id is not None and not ID_RE.match(args.id):
        print("copy: --id must be 1-64 of letters, digits, '_', '.', '-'", file=sys.stderr)
        return 2
    if not args.no_register:
        _warn_unwatched("copy", _registry(args))
    return run_copy(args.src, args.dst, site=args.site, registry_dir=None if args.no_register else _registry(args),
                    listen=args.listen_address, token_file=args.token_file, chunk_size=args.chunk_size,
                    rate_limit=args.rate_limit, io=args.io, checkpoint_bytes=args.checkpoint_size,
                    max_lease=args.max_lease, fresh=args.fresh, linger=args.linger, copy_id=args.id)


#: Programs never a copy: a PID of one of these given to `adopt` is a typo or a mix-up, and the
#: guard would freeze it (the shop itself, at its busiest) with all its children.
NOT_A_COPY = re.compile(r"^(?:nginx|php-fpm[\d.]*|php-cgi|apache2|httpd|mysqld|mariadbd|postgres|redis-server|memcached|"
                        r"systemd(?:-.*)?|init|sshd|dbus-daemon|prometheus|alertmanager|node_exporter|"
                        r"prometheus-.*|gunicorn|uwsgi|unicorn|puma|java|dockerd|containerd.*|kubelet)$")


def _not_adoptable(pid: int) -> str:
    """Why ``pid`` must not be adopted ('' when it may): PID 1, this command or one of its
    parents (a shell, the terminal's session), a kernel thread, or a program that is never a
    copy (a stranger's review: `adopt --pid 1` was accepted; its freeze takes every process)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if pid <= 1 or pid in {p.pid for p in [psutil.Process(), *psutil.Process().parents()]}:
            return "it is PID 1 or this command's own process or one of its parents"
        if proc.ppid() == 2 or not proc.cmdline():
            return "it is a kernel thread"
        name = Path(proc.cmdline()[0]).name.split(":")[0]
        if NOT_A_COPY.match(name) or NOT_A_COPY.match(proc.name()):
            return f"it is {proc.name()} ({' '.join(proc.cmdline())[:120]}), not a copy"
        if "promreflex" in " ".join(proc.cmdline()[:4]) and "copy" not in proc.cmdline()[:4]:
            return "it is a promreflex process"
    except psutil.Error:
        return ""  # (gone: said by the caller)
    return ""


def _adopt(args: argparse.Namespace) -> int:
    pid, pgid = args.pid, args.pgid
    if pgid is not None:
        members = freeze.group_members(pgid)
        if not members:
            print(f"copy-guard adopt: no process in group {pgid}", file=sys.stderr)
            return 1
        pid = pgid if pgid in members else members[0]
        why = next((w for w in map(_not_adoptable, members) if w), "")
    else:
        why = _not_adoptable(pid) if pid is not None else ""
    if pid is None or not pid_alive(pid):
        print(f"copy-guard adopt: no process {pid}", file=sys.stderr)
        return 1
    if why and not (args.force and "PID 1" not in why and "kernel" not in why):
        print(f"copy-guard adopt: not adopting {'group ' + str(pgid) if pgid is not None else 'pid ' + str(pid)}: {why}"
              + ("" if "PID 1" in why or "kernel" in why else "; --force if it really is the copy"), file=sys.stderr)
        return 1
    entry = Entry(id=args.id or new_id("adopted"), kind="adopted", pid=pid, pid_start=process_start(pid),
                  pgid=pgid, site=args.site, src=args.src or "", dst=args.dst or "")
    path = Registry(_registry(args)).add(entry)
    _warn_unwatched("copy-guard adopt", _registry(args))
    how = f"process group {pgid}" if pgid is not None else f"pid {pid} and its children"
    print(f"adopted {how} as {entry.id} for site {args.site} ({path}); pause methods here: "
          f"{', '.join(freeze.detect())}")
    return 0


def _forget(args: argparse.Namespace) -> int:
    registry = Registry(_registry(args))
    entry = next((e for e in registry.entries(include_dead=True) if e.id == args.id), None)
    if entry is None:
        print(f"copy-guard forget: no copy {args.id!r} in {registry.dir} (`copy-guard list` shows them)", file=sys.stderr)
        return 1
    if entry.kind == "adopted":  # frozen now, maybe: thawed first (the record is how)
        from controllers.copy_guard.action import release_adopted

        try:
            release_adopted(registry, entry.id)
        except Exception as exc:  # noqa: BLE001 - said; the entry is removed all the same
            print(f"copy-guard forget: could not resume {entry.id} first: {exc}", file=sys.stderr)
    registry.remove(entry.id)
    print(f"forgot {entry.id} ({entry.kind}, pid {entry.pid}): resumed if it was held, and never paused again"
          + ("" if entry.kind == "adopted" else " (a `promreflex copy` resumes itself within its lease)"))
    return 0


def _copy_state(control_url: str | None) -> str:
    """What a `promreflex copy` says of itself (GET /status on its control endpoint): paused, a
    share of its speed, or running ("?" when it does not answer)."""
    if not control_url:
        return "-"
    try:
        with urllib.request.urlopen(f"{control_url.rstrip('/')}/status", timeout=1.0) as resp:  # noqa: S310 - loopback
            status = json.load(resp)
    except (OSError, ValueError):
        return "?"
    state, share = status.get("state"), status.get("share")
    if state == "paused":
        return "paused"
    if state == "throttled" and isinstance(share, (int, float)) and share < 1:
        return f"{share:.0%}"
    return "no" if state in ("running", "throttled") else str(state)


def _list(args: argparse.Namespace) -> int:
    entries = Registry(_registry(args)).entries()
    if not entries:
        print(f"no copies registered in {_registry(args)}")
        return 0
    print(f"{'id':<28} {'kind':<8} {'site':<10} {'pid':>7} {'held':<14} {'control':<26} src -> dst")
    for e in entries:
        if e.kind != "adopted":
            held = _copy_state(e.control_url)
        elif not e.pause:
            held = "no"
        else:  # paused, or running a share of each duty period
            share = freeze.duty(e.pause)
            held = f"{e.pause.get('method', '')} {'paused' if share <= 0 else f'{share:.0%}'}"
        print(f"{e.id:<28} {e.kind:<8} {e.site:<10} {e.pid:>7} {held:<14} {e.control_url or '-':<26} "
              f"{e.src} -> {e.dst}")
    return 0


def _resume_all(args: argparse.Namespace) -> int:
    return asyncio.run(_resume_all_async(args))


async def _resume_all_async(args: argparse.Namespace) -> int:
    import aiohttp

    from controllers.copy_guard.action import ControlClient, Held, release_adopted
    from promreflex.httpd import read_token_file

    token = read_token_file(args.token_file, "--control.token-file")
    failed = 0
    async with aiohttp.ClientSession() as session:
        control = ControlClient(session, token, args.control_hosts)
        registry = Registry(_registry(args))
        for e in registry.entries():
            try:
                if e.kind == "copier":
                    await control(Held(e.id, e.kind, e.control_url), "resume")
                else:
                    release_adopted(registry, e.id)
                print(f"resumed {e.id}")
            except Exception as exc:  # noqa: BLE001 - report each and go on
                failed += 1
                print(f"could not resume {e.id}: {exc}", file=sys.stderr)
    return 1 if failed else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``copy`` and ``copy-guard`` to a CLI's subcommands."""
    cp = subparsers.add_parser("copy", help="copy a file or tree: resumable, pausable, throttled, with /metrics",
                               description="Copy SRC to DST (a file or a directory tree). Resumable: run the same "
                               "command again after a stop or a kill. Exit 0 done, 1 failed, 2 usage, 3 stopped; as rsync, "
                               "23 done but some files or folders could not be read, 24 done but some source files "
                               "vanished (each named in the log).")
    cp.add_argument("src")
    cp.add_argument("dst")
    cp.add_argument("--site", type=_site, default="shop", help="the site whose overload pauses this copy (default shop)")
    cp.add_argument("--registry.dir", dest="registry_dir", type=_abs_path, default=None, help=REGISTRY_HELP)
    cp.add_argument("--no-register", action="store_true", help="do not register (the guard will not see it)")
    cp.add_argument("--web.listen-address", dest="listen_address", default="127.0.0.1:0",
                    help="/metrics and control endpoint (default: a free loopback port)")
    cp.add_argument("--web.token-file", dest="token_file",
                    help="bearer token for control (required beyond loopback; mode 0600). The guard's route sends "
                         "the token of its control_token_file param: give both the same token")
    cp.add_argument("--chunk-size", type=parse_size, default=1 << 20, help="bytes per read/write (default 1M)")
    cp.add_argument("--rate-limit", type=parse_size, default=0, help="bytes per second, 0 = none (default 0)")
    cp.add_argument("--io", choices=IO_MODES, default="fadvise",
                    help="fadvise: drop cache pages behind (default); direct: O_DIRECT; buffered: like cp")
    cp.add_argument("--checkpoint-size", type=parse_size, default=16 << 20,
                    help="journal (and fdatasync) every this many bytes (default 16M)")
    cp.add_argument("--max-lease", type=float, default=600.0, help="longest pause lease accepted, seconds")
    cp.add_argument("--fresh", action="store_true", help="ignore an existing journal and plan again")
    cp.add_argument("--linger", type=float, default=0.0, help="keep /metrics up this many seconds after the end")
    cp.add_argument("--id", help="registry id (default: generated)")
    cp.add_argument("--log.level", dest="log_level", default="info", choices=["debug", "info", "warning", "error"])
    cp.set_defaults(func=_copy)

    guard = subparsers.add_parser("copy-guard", help="copies the copy guard may pause: adopt, list, resume-all, doctor")
    sub = guard.add_subparsers(dest="copy_guard_command", metavar="{adopt,forget,list,resume-all,doctor}")
    sub.required = True
    from controllers.copy_guard.doctor import add_doctor_parser

    add_doctor_parser(sub)
    ad = sub.add_parser("adopt", help="register a running rsync/cp/tar so the guard pauses it")
    who = ad.add_mutually_exclusive_group(required=True)
    who.add_argument("--pid", type=int, help="the process (its children are paused with it)")
    who.add_argument("--pgid", type=int, help="the whole process group (a pipeline)")
    ad.add_argument("--site", type=_site, default="shop")
    ad.add_argument("--src", help="for the listing only")
    ad.add_argument("--dst", help="for the listing only")
    ad.add_argument("--id")
    ad.add_argument("--force", action="store_true",
                    help="adopt a program that is never a copy by its name (nginx, a database...): never PID 1")
    fg = sub.add_parser("forget", help="unregister a copy (an adoption made by mistake): the guard lets it be")
    fg.add_argument("id", help="its id, as `copy-guard list` shows it")
    ra = sub.add_parser("resume-all", help="resume every registered copy now")
    ra.add_argument("--control.token-file", dest="token_file", type=Path,
                    help="bearer token for copies started with --web.token-file (the route's control_token_file)")
    ra.add_argument("--control.host", dest="control_hosts", action="append", default=[], metavar="HOST",
                    help="a host beyond loopback whose copies may be resumed (repeat; the route's control_hosts)")
    for p in (ad, sub.add_parser("list", help="registered copies"), ra, fg):
        p.add_argument("--registry.dir", dest="registry_dir", type=_abs_path, default=None, help=REGISTRY_HELP)
    ad.set_defaults(func=_adopt)
    fg.set_defaults(func=_forget)
    sub.choices["list"].set_defaults(func=_list)
    sub.choices["resume-all"].set_defaults(func=_resume_all)
