"""Test, reload and safely change a running nginx: edit -> ``nginx -t`` -> reload -> health check.

Reload: SIGHUP to the master named in the pid file (the same thing ``nginx -s reload`` does,
without it re-parsing the config just to find the pid file). It is asynchronous, so
:meth:`NginxControl.reload` then WAITS, polling the master's children (psutil):

- success = new children appeared (the master started workers of the new cycle) and, once
  all old workers are gone, ``drained`` is true. Memory measured before that would count
  two generations of workers, so a sweep must wait for ``drained``.
- failure = the master logged ``[emerg]`` to its error log since the signal and no new
  workers appeared within ``emerg_grace`` (nginx retries a busy ``bind()`` 5 x 500 ms, so an
  emerg line alone is not yet final), or no new workers appeared before the deadline.
  After a failed reload the master keeps running its previous cycle: nothing is broken.

Why ``worker_shutdown_timeout`` matters (checked on nginx 1.22 here): an old worker closes
its *idle* keepalive connections at once when it starts shutting down, so idle clients do
not hold it, whatever ``keepalive_timeout`` is. What holds it is a request in progress: a
slow download, a slow upstream, a long poll; each can keep the old worker (its memory and
its old settings) alive for up to ``send_timeout``/``proxy_read_timeout`` per operation, and
every reload of a sweep would pile up another generation. ``worker_shutdown_timeout`` (main
context) ends such requests that long after shutdown starts: with ``2s`` a stalled 16 MiB
download was cut and the old worker gone ~2 s after the reload (integration test). It does
NOT cut a connection still sending its request header: nginx's header reader ignores the
shutdown flag, so that one waits for ``client_header_timeout`` (60 s default; seen holding an
old worker past a 20 s deadline). Configs this controller reloads should set
``worker_shutdown_timeout`` and a modest ``client_header_timeout``, with ``reload_timeout``
above both. If old workers still linger at the deadline, the reload counts as done (the new
config serves new connections) but ``drained`` is false and the lingering PIDs are
reported, so a sweep can wait longer or discard that trial's memory reading.

Apply (:meth:`NginxControl.apply`), serialised by a thread lock and an ``flock`` so two
controllers never interleave:
1. precheck: the master runs and the current config passes ``nginx -t``; otherwise touch
   nothing (the backup taken next would not be a *good* config);
2. edit one line (:mod:`config_edit`, atomic, pre-edit content backed up);
3. ``nginx -t`` fails -> restore the backup; the master never saw the bad file;
4. reload fails -> restore; re-signal only if the master might still pick up the new file
   (deadline without an ``[emerg]``), so disk and running config agree;
5. health check fails -> restore, ``nginx -t``, reload, health check again.
The result says which stage failed, whether it rolled back and whether nginx is serving
the last good config afterwards.

A sweep's journal (:meth:`NginxControl.begin_sweep`): the backup above holds the file before
the LAST edit, i.e. the previous trial's. What a sweep must return to is the file before its
FIRST edit, so ``begin_sweep`` writes it (the one file the tuner edits, and its text) to
``<backup dir>/sweep.json`` before the first trial, durably; :meth:`restore_original` puts it
back and makes it live (``nginx -t``, reload, health) on any way a sweep ends without its
choice applied (an error, a cancellation, nginx not returning to health); :meth:`end_sweep`
removes it once the choice is live. A controller killed mid-sweep finds the journal at its
next start (:meth:`recover`) or sweep, and the original comes back before anything reads the
"current" value (which would otherwise be a trial's).

The Keep-Alive header timeout (``keepalive_timeout T H``): an edit writes H as min(H0, T),
where H0 is the header the administrator configured, read before this control's first edit
(and recorded in the sweep journal, so a controller restarted mid-sweep clamps against it
too), never the header a previous trial lowered: starting from ``65 60``, a trial at 30
writes ``30 30`` and a later 75 writes ``75 60``, whatever the order of the trials.
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import json
import os
import stat
import re
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from controllers.nginx_tuner import config_edit
from controllers.nginx_tuner.config_edit import ConfigEditError, EditResult, nginx_seconds
from controllers.nginx_tuner.metrics import TunerMetrics
from controllers.nginx_tuner.procfs import children, cmdline, start_time
from promreflex.fsutil import atomic_write_text
from promreflex.proc import Timeout, pid_alive, wait_until

__all__ = ["NOT_RUNNING", "ApplyResult", "NginxControl", "NginxError", "ReloadResult", "nginx_seconds"]

#: nginx's built-in ``keepalive_timeout`` (the value in force when no enclosing block sets one).
NGINX_DEFAULT_KEEPALIVE_S = 75.0

#: Copies kept aside per file and kind (``.at-recovery-``, ``.pre-sweep-``): the newest ones.
ASIDE_KEPT = 10
#: How :meth:`NginxControl.restore_original` ends when the file is back but no nginx serves it:
#: a sweep that kept its value then has not ended well (nginx is down), whatever the file says.
NOT_RUNNING = "nginx is not running"

#: A configuration file written this soon after nginx last read its files (NginxControl.loaded_at)
#: counts as read (a process's start time has the kernel's clock tick, 10 ms, as its resolution).
PENDING_SLACK_S = 0.05

Stage = Literal["done", "unchanged", "precheck", "edit", "test", "reload", "health"]

class NginxError(Exception):
    """nginx is not in a state this controller can work with (no master, bad pid file...)."""


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    message: str
    old_workers: tuple[int, ...]
    new_workers: tuple[int, ...]
    drained: bool  # every old worker is gone
    lingering: tuple[int, ...] = ()  # old workers still alive at the deadline
    emerg: str = ""  # first [emerg]/[alert] line logged after the signal
    seconds: float = 0.0


@dataclass
class ApplyResult:
    ok: bool
    value: str
    stage: Stage  # "done"/"unchanged" on success, else the stage that failed
    message: str
    rolled_back: bool = False
    serving_last_good: bool = True  # False only when even the rollback could not be made live
    edit: EditResult | None = None
    reload: ReloadResult | None = None
    rollback_reload: ReloadResult | None = None
    notes: list[str] = field(default_factory=list)


def _written_of(record: dict) -> list[str] | None:
    """A journal's hashes of the texts its sweep wrote (None: a journal from before they were kept)."""
    got = record.get("written")
    return [w for w in got if isinstance(w, str)] if isinstance(got, list) else None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def edit_only_differs(before: str, after: str, directive: str) -> bool:
    """Whether ``after`` differs from ``before`` by no more than one edit of ``directive``
    leaves (:func:`config_edit.set_directive`): one line replaced by a line that names it, or
    one line inserted that names it."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if len(ops) != 1:
        return False
    tag, i1, i2, j1, j2 = ops[0]
    names = re.compile(rf"(^|[\s;{{}}]){re.escape(directive)}(\s|;|$)")
    return j2 - j1 == 1 and (tag == "insert" or (tag == "replace" and i2 - i1 == 1)) and bool(names.search(b[j1]))


def probe(url: str, timeout: float = 2.0) -> str:
    """'' when GET ``url`` answers 2xx, else why not. A certificate is not verified: the probe asks
    whether nginx serves, as the load generator (which does not verify either) will send to it; a
    staging site's self-signed certificate, or a real one reached as https://127.0.0.1, is no
    reason to call nginx unhealthy."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as resp:  # noqa: S310 - the operator's health URL
            return "" if 200 <= resp.status < 300 else f"{url} answered HTTP {resp.status}"
    except urllib.error.HTTPError as e:
        return f"{url} answered HTTP {e.code}"
    except urllib.error.URLError as e:
        return f"{url}: {e.reason}"
    except (OSError, ValueError) as e:
        return f"{url}: {e}"


def _run(argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)  # noqa: S603


class NginxControl:
    """Control of one nginx instance given by its ``-c`` config and ``-p`` prefix."""

    def __init__(
        self,
        conf_path: str | os.PathLike,
        prefix: str | os.PathLike,
        nginx_bin: str = "/usr/sbin/nginx",
        *,
        directive: str = "keepalive_timeout",
        server_name: str | None = None,
        health_url: str | None = None,
        health_check: Callable[[], bool] | None = None,
        pid_path: str | os.PathLike | None = None,
        backup_dir: str | os.PathLike | None = None,
        reload_timeout: float = 30.0,
        emerg_grace: float = 3.0,
        health_timeout: float = 10.0,
        metrics: TunerMetrics | None = None,
    ):
        # absolute(), not resolve(): nginx reads relative includes from the directory of the -c
        # path as given, so a symlinked nginx.conf must be tested and edited as nginx reads it
        self.conf_path = Path(conf_path).absolute()
        self.prefix = Path(prefix).resolve()
        self.nginx_bin = nginx_bin
        self.directive = directive
        self.server_name = server_name
        self.health_url = health_url
        self._health_check = health_check
        self._pid_path = Path(pid_path) if pid_path is not None else None
        self.backup_dir = Path(backup_dir) if backup_dir is not None else self.conf_path.parent / config_edit.DEFAULT_BACKUP_DIRNAME
        self.reload_timeout = reload_timeout
        self.emerg_grace = emerg_grace
        self.health_timeout = health_timeout
        self.metrics = metrics
        self._lock = threading.Lock()
        self._sweep_fh: Any = None  # the sweep lock, held from begin_sweep to the sweep's end
        self._health_why = ""  # why the last probe of health_url failed
        # the arguments after the first (the Keep-Alive header timeout) as configured before
        # this control's first edit; None until read (see _original_rest)
        self._rest: tuple[str, ...] | None = None

    # ------------------------------------------------------------------ paths & pids

    @cached_property
    def _build_paths(self) -> dict[str, str]:
        """``--pid-path=`` etc. from ``nginx -V``: the defaults when the config names none."""
        try:
            out = _run([self.nginx_bin, "-V"]).stderr
        except (OSError, subprocess.TimeoutExpired):  # (nginx -t says why, as a failed check)
            return {}
        return {m[1]: m[2] for m in re.finditer(r"--([a-z-]+-path)=(\S+)", out)}

    def _in_prefix(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else self.prefix / p

    @property
    def pid_path(self) -> Path:
        if self._pid_path is not None:
            return self._pid_path
        args = config_edit.main_args(self.conf_path, "pid")
        if args:
            return self._in_prefix(args[-1][0])
        return self._in_prefix(self._build_paths.get("pid-path", "logs/nginx.pid"))

    @property
    def error_log(self) -> Path | None:
        """The master's error log file, or None when it logs to stderr/syslog/memory."""
        candidates = [a[0] for a in config_edit.main_args(self.conf_path, "error_log") if a]
        if not candidates:
            candidates = [self._build_paths.get("error-log-path", "logs/error.log")]
        for c in candidates:
            if c != "stderr" and not c.startswith(("syslog:", "memory:")) and c != "/dev/null":
                return self._in_prefix(c)
        return None

    def master_pid(self) -> int:
        """PID of the running master, checked against /proc (a stale pid file is an error)."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError) as e:
            hint = ("; is nginx running with this config, and is --nginx.prefix (or --nginx.pid-file) its -p prefix "
                    f"({self.prefix})?") if isinstance(e, FileNotFoundError) else ""
            raise NginxError(f"cannot read nginx pid file {self.pid_path}: {e}{hint}") from e
        if not pid_alive(pid) or "master process" not in cmdline(pid):
            raise NginxError(f"pid {pid} from {self.pid_path} is not a running nginx master")
        return pid

    def workers(self) -> list[int]:
        """Current children of the master (workers, plus cache manager/loader if configured)."""
        return children(self.master_pid())

    def current_value(self) -> tuple[str, ...] | None:
        """The arguments set directly in the tuned scope (what an edit replaces), or None."""
        loc = config_edit.get_directive(self.conf_path, self.directive, self.server_name)
        return loc.args if loc else None

    def effective_seconds(self) -> float:
        """The ``keepalive_timeout`` in force for the tuned scope, in seconds: the nearest
        definition going up (the named server's own, else the ``http`` block's), else nginx's
        built-in 75 s. Raises :class:`ConfigEditError` (unreadable config, ambiguous server)
        or ValueError (not a time)."""
        loc = config_edit.effective_directive(self.conf_path, self.directive, self.server_name)
        return nginx_seconds(loc.args[0]) if loc else NGINX_DEFAULT_KEEPALIVE_S

    def check_tunable(self) -> None:
        """Raise :class:`ConfigEditError` when :meth:`apply` would refuse every value because of
        the configuration's layout: the server name is ambiguous, the config cannot be read, a
        server/location below the tuned scope sets its own value (the edit would not reach its
        traffic), or the directive lives in a snippet that other blocks include too."""
        config_edit.check_tunable(self.conf_path, self.directive, self.server_name)

    def loaded_at(self) -> float:
        """When nginx last read its configuration (Unix time): the start of the OLDEST worker of
        the generation that serves (a reload starts all of them at once; the master also forks
        one alone in place of a worker that died, which read nothing: the newest would say a
        crash re-read the files), else of any child, else of the master. Workers of the previous
        generation still draining are titled "is shutting down" and left out."""
        master = self.master_pid()
        kids = children(master)
        serving = [k for k in kids if cmdline(k).endswith("worker process")]
        times = [t for t in map(start_time, serving or kids or [master]) if t is not None]
        if not times:
            raise NginxError(f"cannot read the start time of nginx master {master}'s processes")
        return min(times) if serving else max(times)

    def pending_files(self) -> list[Path]:
        """The configuration's files (``include``d ones too) changed after nginx last read its
        configuration, and the folders of its wildcard ``include``s (a file added or removed
        there: a site enabled or disabled): a reload, ours included, would make those changes
        live. By modification time: a file's, and a link's own (``ln -s ../sites-available/x
        sites-enabled/``: the link is new, the file it names old), so a deployment that keeps
        its files' old times (``rsync -t``, ``cp -p``) is not seen, and a change within
        :data:`PENDING_SLACK_S` after a reload counts as loaded."""
        loaded = self.loaded_at() + PENDING_SLACK_S
        out = []
        for f in config_edit.watched_paths(self.conf_path):
            try:
                if max(f.stat().st_mtime, f.lstat().st_mtime) > loaded:
                    out.append(f.absolute())
            except OSError:
                continue
        return out

    def _pending_message(self, pending: Sequence[Path]) -> str:
        names = ", ".join(str(f) for f in pending[:3]) + (f" and {len(pending) - 3} more" if len(pending) > 3 else "")
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.loaded_at()))
        return (f"{names} changed on disk after nginx last loaded its configuration ({at}); a reload would make "
                "that live too: reload nginx yourself once it is meant to be live (or put the files back), then tune")

    # ------------------------------------------------------------------ test & reload

    def test(self) -> tuple[bool, str]:
        """``nginx -t -c CONF -p PREFIX``: (passed, nginx's message)."""
        try:
            proc = _run([self.nginx_bin, "-t", "-q", "-c", str(self.conf_path), "-p", f"{self.prefix}/"])
        except subprocess.TimeoutExpired:
            return False, "nginx -t timed out"
        except OSError as e:  # (a binary that is not there: said, never a traceback)
            return False, f"cannot run {self.nginx_bin}: {e.strerror or e}"
        return proc.returncode == 0, (proc.stderr or proc.stdout).strip()

    @staticmethod
    def _log_size(log: Path | None) -> int:
        try:
            return log.stat().st_size if log else 0
        except OSError:
            return 0

    @staticmethod
    def _new_emerg(log: Path | None, offset: int) -> str:
        """First ``[emerg]``/``[alert]`` line written to ``log`` after ``offset``, or ''."""
        if log is None:
            return ""
        try:
            with open(log, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read(1 << 20).decode(errors="replace")
        except OSError:
            return ""
        return next((ln for ln in chunk.splitlines() if "[emerg]" in ln or "[alert]" in ln), "")

    def reload(self, timeout: float | None = None) -> ReloadResult:
        """SIGHUP the master, then wait for new workers and for the old ones to exit."""
        timeout = self.reload_timeout if timeout is None else timeout
        master = self.master_pid()
        old = set(children(master))
        log = self.error_log
        offset = self._log_size(log)
        start = time.monotonic()
        os.kill(master, signal.SIGHUP)
        emerg, emerg_at = "", None
        new: set[int] = set()
        while True:
            elapsed = time.monotonic() - start
            if not pid_alive(master):
                return ReloadResult(False, f"master {master} exited during reload", tuple(sorted(old)), (), False, seconds=elapsed)
            kids = set(children(master))
            new |= kids - old
            alive_old = old & kids
            if new and not alive_old:
                return ReloadResult(True, "reloaded; old workers gone", tuple(sorted(old)), tuple(sorted(kids - old)), True, seconds=elapsed)
            if not new:
                if not emerg:
                    emerg = self._new_emerg(log, offset)
                    emerg_at = time.monotonic() if emerg else None
                if emerg and emerg_at is not None and time.monotonic() - emerg_at >= self.emerg_grace:
                    return ReloadResult(False, f"reload refused by nginx: {emerg}", tuple(sorted(old)), (), False, tuple(sorted(alive_old)), emerg, elapsed)
            if elapsed >= timeout:
                if new:
                    return ReloadResult(
                        True, f"reloaded, but old workers {sorted(alive_old)} still draining after {timeout:.0f}s (set worker_shutdown_timeout)",
                        tuple(sorted(old)), tuple(sorted(kids - old)), False, tuple(sorted(alive_old)), emerg, elapsed,
                    )
                return ReloadResult(False, f"no new workers within {timeout:.0f}s", tuple(sorted(old)), (), False, tuple(sorted(alive_old)), emerg, elapsed)
            time.sleep(0.05)

    def health(self) -> bool:
        """One health probe: the injected check, else a 2xx GET of ``health_url`` (why not is
        kept for the messages), else True."""
        if self._health_check is not None:
            return bool(self._health_check())
        if self.health_url is not None:
            self._health_why = probe(self.health_url, timeout=2.0)
            return not self._health_why
        return True

    def _healthy_within(self) -> bool:
        try:
            wait_until(self.health, timeout=self.health_timeout, interval=0.1, what="nginx health check")
            return True
        except Timeout:
            return False

    # ------------------------------------------------------------------ apply

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        self.backup_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # O_NOFOLLOW: the config's directory may be writable by its deploy user, and a lock
        # opened by root through a planted link would create or touch any file
        fd = os.open(self.backup_dir / ".lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with self._lock, os.fdopen(fd, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # ------------------------------------------------------------------ sweep journal
    def _sweep_lock(self, hold: bool) -> None:
        """Take the sweep lock (``backup_dir/.sweep.lock``, an flock: released when the process
        dies); ``hold``: keep it (a sweep starts), else just check that no other sweep holds it.
        Raises NginxError naming the process of a sweep that runs: a second run took the first's
        live journal for an interrupted sweep's and "recovered" it mid-trial, and the two sweeps
        then measured each other's values (a review)."""
        if self._sweep_fh is not None:
            return  # (ours)
        self.backup_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.backup_dir / ".sweep.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fh = os.fdopen(fd, "r+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = fh.read().strip()
            fh.close()
            raise NginxError(f"a sweep of this configuration runs ({who or 'another process'}): not starting another; "
                             "wait for it to end (each would measure the other's values)") from None
        if not hold:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()
            return
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}, since {time.strftime('%H:%M:%S')}\n")
        fh.flush()
        self._sweep_fh = fh

    def _sweep_unlock(self) -> None:
        if self._sweep_fh is not None:
            fcntl.flock(self._sweep_fh, fcntl.LOCK_UN)
            self._sweep_fh.close()
            self._sweep_fh = None

    @property
    def journal_path(self) -> Path:
        return self.backup_dir / "sweep.json"

    def begin_sweep(self) -> str:
        """Before a sweep's first change: put back what an interrupted sweep left (its
        original, see :meth:`recover`), then record the file the sweep will edit and its text
        now. Returns what was recovered ('' when nothing). Raises NginxError when an
        interrupted sweep's original cannot be made live, or when :meth:`apply` would refuse
        any value now (:meth:`_precheck`): nothing new starts then, and no journal is written
        (the journal of a sweep that changed nothing would later be "recovered" over a newer
        deployment)."""
        self._sweep_lock(hold=True)
        try:
            with self._exclusive():
                recovered = self._recover()
                why = self._precheck()  # (each trial checks again; this one writes no journal when it fails)
                if why:
                    raise NginxError(f"not starting the sweep, nothing changed: {why}")
                file = config_edit.target_file(self.conf_path, self.directive, self.server_name)
                if self._rest is None:  # (known already when this control edited before the sweep)
                    self._rest = self._file_rest()
                record = {"file": str(file), "content": config_edit.read_text(file), "started": time.time(),
                          "rest": list(self._rest), "written": []}
                atomic_write_text(self.journal_path, json.dumps(record), mode=0o600)
        except BaseException:  # (a full disk, a cancellation: no sweep started, the lock goes too)
            self._sweep_unlock()
            raise
        return recovered

    def end_sweep(self) -> None:
        """The sweep's choice is live: its original is no longer needed."""
        with self._exclusive():
            self.journal_path.unlink(missing_ok=True)
        self._sweep_unlock()

    def recover(self) -> str:
        """What :meth:`restore_original` does, for a journal left by a sweep that did not end
        (a SIGKILL): '' when there is none. Refused while another process's sweep runs (its
        journal is live, not left)."""
        self._sweep_lock(hold=False)
        with self._exclusive():
            return self._recover()

    def restore_original(self, keep: bool = False) -> str:
        """Put back the file as it was before the sweep and make it live; says what it did.
        The journal stays (and the next sweep or start tries again) until nginx serves it, and
        with ``keep`` after that too (a sweep that goes on)."""
        self._sweep_lock(hold=False)
        try:
            with self._exclusive():
                return self._recover(keep) or "no sweep journal: nothing to restore"
        finally:
            if not keep:  # the sweep is over, however its restore went (a journal kept is the next start's)
                self._sweep_unlock()

    def _read_journal(self) -> tuple[Path, str, tuple[str, ...] | None, frozenset[str] | None] | None:
        """The journal's (file, text, the arguments after the first as configured before the
        sweep, None in a journal without them; the hashes of the texts the sweep wrote, None in
        a journal from before they were kept), or None when there is none. Trusted only when this
        process's user wrote it: a regular file of its own, mode 0600, not reached through a
        link, naming the file this tuner edits (the configuration's directory may be writable
        by a deploy user, and recovery writes as the controller's user: root)."""
        try:
            fd = os.open(self.journal_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise NginxError(f"sweep journal {self.journal_path}: {e.strerror}; check the config by hand, "
                             "then remove the journal") from None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            problem = ("not a regular file" if not stat.S_ISREG(st.st_mode) else
                       f"owned by uid {st.st_uid}, not this process's" if st.st_uid != os.geteuid() else
                       f"mode {stat.filemode(st.st_mode)}, not 0600" if st.st_mode & 0o077 else "")
            data = fh.read(16 << 20) if not problem else b""
        try:
            if problem:
                raise ValueError(problem)
            record = json.loads(data.decode("utf-8"))
            file, content, rest = Path(record["file"]), record["content"], record.get("rest")
            if not isinstance(content, str):
                raise ValueError("content is not text")
            if rest is not None and (not isinstance(rest, list) or not all(isinstance(a, str) for a in rest)):
                raise ValueError("rest is not a list of arguments")
            target = config_edit.target_file(self.conf_path, self.directive, self.server_name)
            if file.absolute() != target.absolute():
                if file.absolute() in {f.absolute() for f in config_edit.config_files(self.conf_path)}:
                    # Another scope's sweep of this same configuration did not end: its own
                    # run puts it back; the journal is not ours to act on, nor to be removed.
                    raise NginxError(f"a sweep of {file} (another scope of this configuration) did not end; its "
                                     f"journal {self.journal_path} puts it back at the next tune-nginx or controller "
                                     "start for that scope (--nginx.server-name); run that first")
                raise ValueError(f"it names {file}, not {target}, the file this tuner edits")
        except (ValueError, KeyError, TypeError, ConfigEditError) as e:
            raise NginxError(f"sweep journal {self.journal_path} is not trusted ({e}); "
                             "check the config by hand, then remove the journal") from None
        written = _written_of(record)
        return file, content, None if rest is None else tuple(rest), None if written is None else frozenset(written)

    def _note_written(self, file: Path, text: str) -> None:
        """Before an edit is written during a sweep: its text's hash goes into the journal, so
        that recovery tells a file this sweep wrote from one someone else wrote since, even on
        the tuned line alone (an operator's deliberate value was put back and reloaded: a
        stranger's review). Written first, so a SIGKILL between the two leaves a known text."""
        try:
            fd = os.open(self.journal_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return  # no sweep going on
        with os.fdopen(fd, "rb") as fh:
            try:
                record = json.loads(fh.read(16 << 20).decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                return
        if not isinstance(record, dict) or Path(str(record.get("file"))).absolute() != file.absolute():
            return
        written = _written_of(record) or []
        digest = _digest(text)
        if digest not in written:
            record["written"] = [*written, digest][-256:]
            atomic_write_text(self.journal_path, json.dumps(record), mode=0o600)

    def _file_rest(self) -> tuple[str, ...]:
        """The arguments after the first set in the tuned scope now (``()``: none, or unset). A
        server that sets none inherits http's (nginx merges the Keep-Alive header timeout on its
        own): a trial written with one argument left clients told ``timeout=60`` by the header
        while the connection closed at 20 s (a review)."""
        loc = config_edit.get_directive(self.conf_path, self.directive, self.server_name)
        if loc is not None and len(loc.args) > 1:
            return loc.args[1:]
        if self.server_name is not None:
            parent = config_edit.get_directive(self.conf_path, self.directive, None)
            if parent is not None and len(parent.args) > 1:
                return parent.args[1:]
        return ()

    def _original_rest(self) -> tuple[str, ...]:
        """The arguments after the first (the Keep-Alive header timeout) as the administrator
        configured them: remembered from before this control's first edit; a control started
        while a sweep's journal is on disk (the previous one was killed mid-sweep, the file
        holds a trial's) takes them from the journal, else from the file."""
        if self._rest is None:
            try:
                found = self._read_journal()
            except NginxError:  # (an untrusted journal: recovery refuses it and says so)
                found = None
            rest = found[2] if found is not None else None
            self._rest = rest if rest is not None else self._file_rest()
        return self._rest

    def _aside(self, file: Path, what: str, text: str) -> Path:
        """Keep ``text`` beside the backups under a name of its own (never one another's); of
        each kind the newest :data:`ASIDE_KEPT` are kept (every sweep that kept the current value
        left one more, for good: a review)."""
        # one clock reading for both parts: two (the second, then the nanoseconds) could straddle
        # a second's end and stamp a new copy before an older one (a flaky ordering on CI)
        ns = time.time_ns()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(ns // 1_000_000_000)) + f".{ns % 1_000_000_000:09d}Z"
        base = f"{config_edit.backup_path(file, self.backup_dir)}.{what}-"
        aside = Path(base + stamp)
        atomic_write_text(aside, text, mode=0o600)
        kept = sorted(p for p in aside.parent.iterdir() if str(p).startswith(base))  # (the stamps sort in time)
        for old in kept[:-ASIDE_KEPT]:
            try:
                old.unlink()
            except OSError:
                pass
        return aside

    def _recover(self, keep: bool = False) -> str:
        found = self._read_journal()
        if found is None:
            return ""
        file, content, _, written = found
        try:
            now = config_edit.read_text(file)
        except (OSError, ConfigEditError):
            now = None
        foreign = False
        if now is not None and now != content:
            # not a text this sweep wrote (or, in a journal without their hashes, not what a
            # trial's edit looks like): someone else's
            foreign = _digest(now) not in written if written is not None else not edit_only_differs(content, now, self.directive)
        if foreign:
            # Someone deployed since. Their file stays as it is; the pre-sweep text is kept for
            # them to compare.
            aside = self._aside(file, "pre-sweep", content)
            self.journal_path.unlink(missing_ok=True)
            return (f"{file} holds a text the interrupted sweep did not write (a newer deployment?): left as it is, "
                    f"not reloaded; the pre-sweep text is kept in {aside} (check the file's {self.directive}: a "
                    "trial's value may have come with the deployment)")
        changed = now != content
        kept = ""
        if changed and now is not None and not keep:  # (a trial's: kept beside the backups; mid-sweep it is this sweep's own)
            kept = f" (what it held is kept in {self._aside(file, 'at-recovery', now)})"
        if changed:
            # Our own write bumps the time of the file's folder, which pending_files watches for a
            # wildcard include (conf.d/*.conf, sites-enabled/): the folder keeps the time it had,
            # or our restore refused its own reload and nginx kept serving the last trial's value
            # (a review). A change of someone else's there still shows: its time was later already.
            folder = (file.resolve() if file.is_symlink() else file).parent
            try:
                st = folder.stat()
                folder_times: tuple[int, int] | None = (st.st_atime_ns, st.st_mtime_ns)
            except OSError:
                folder_times = None
            config_edit.atomic_write(file, content)
            if folder_times is not None:
                try:
                    os.utime(folder, ns=folder_times)
                except OSError:
                    pass
        what = f"the pre-sweep {file} " + (f"put back{kept}" if changed else "already on disk")
        try:
            self.master_pid()
        except NginxError:  # nginx does not run: it starts on the original
            self.journal_path.unlink(missing_ok=True)
            return f"{what}; {NOT_RUNNING}"
        try:
            pending = self.pending_files()
        except ConfigEditError as e:
            raise NginxError(f"{what}, but the config cannot be read ({e}); the journal {self.journal_path} is kept") from None
        if not changed and file.absolute() not in pending:
            # nginx loaded the file after it was last written: what runs is the original
            if not keep:
                self.journal_path.unlink(missing_ok=True)
            return f"{what} and loaded"
        others = [f for f in pending if f != file.absolute()]
        if others:
            raise NginxError(f"{what}, but not reloaded: {self._pending_message(others)}; the journal "
                             f"{self.journal_path} is kept (the next start puts the file back live once nginx has loaded those)")
        ok, msg = self.test()
        if not ok:
            raise NginxError(f"{what}, but it fails nginx -t ({msg}); the journal {self.journal_path} is kept")
        reload = self.reload()
        if not reload.ok:
            raise NginxError(f"{what}, but the reload failed ({reload.message}); the journal {self.journal_path} is kept")
        if not self._healthy_within():
            raise NginxError(f"{what} and reloaded, but the health check fails; the journal {self.journal_path} is kept")
        if not keep:
            self.journal_path.unlink(missing_ok=True)
        return f"{what} and live"

    def _state(self, state: str) -> None:
        if self.metrics is not None:
            self.metrics.set_state(state)

    def apply(self, value: str | int | Sequence[str]) -> ApplyResult:
        """Set the directive to ``value`` and make it live, or roll back and say why.

        Never raises for nginx trouble: every failure is a result with ``stage`` and
        ``message``, a config it cannot read (a missing include, an ambiguous server name)
        included: that is a ``precheck`` failure. It also refuses at ``precheck``, touching
        nothing, when the edit would not reach the traffic of the tuned scope (a server or
        location below it sets its own value: tune that server with ``server_name``, or remove
        the override) or would change other servers too (a shared snippet): see
        :meth:`check_tunable`. The ``keepalive_timeout`` second argument (the Keep-Alive header
        timeout) is written as configured before this control's first edit, lowered to the new
        value when above it (the message says so): a header a previous edit lowered comes back
        when the new value allows it. An unexpected
        exception after the edit (master vanished mid-reload, disk error...) still restores the
        backup before it is reported.
        """
        shown = value if isinstance(value, (str, int)) else " ".join(value)
        res = ApplyResult(False, str(shown), "precheck", "")
        with self._exclusive():
            self._state("applying")
            try:
                self._apply(value, res)
            finally:
                self._state("rolled_back" if res.rolled_back else "idle")
            if res.ok and self.metrics is not None:
                try:
                    self.metrics.set_applied(self.effective_seconds())
                except (ValueError, ConfigEditError) as e:
                    res.notes.append(f"cannot read the applied value back ({e}); gauge not updated")
        return res

    def _precheck(self) -> str:
        """Why nothing may be changed now ('' when it may): no master, a config that already
        fails ``nginx -t`` (the backup taken next would not be a *good* config), a layout the
        edit would not reach (:meth:`check_tunable`), edits on disk that nginx has not loaded
        (a reload would make them live with ours: :meth:`pending_files`), or a health check
        that already fails (a rollback could not bring back a health that was never there)."""
        try:
            master = self.master_pid()
        except NginxError as e:
            return str(e)
        except ConfigEditError as e:  # (the pid file's path comes from the config)
            ok, msg = self.test()
            return f"it already fails nginx -t: {msg}" if not ok else str(e)
        other = self._master_config(master)
        if other is not None:
            return (f"the nginx behind the pid file (master {master}) runs {other}, not {self.conf_path}: a reload "
                    "would reload that one (a copy of a configuration that shares its pid path?)")
        ok, msg = self.test()
        if not ok:
            return f"it already fails nginx -t: {msg}"
        try:  # an override below the tuned scope, an ambiguous server, a shared snippet
            self.check_tunable()
            pending = self.pending_files()
        except ConfigEditError as e:
            return str(e)
        if pending:
            return self._pending_message(pending)
        if not self._healthy_within():
            return "the health check already fails" + (f" ({self._health_why})" if self._health_why else "")
        return ""

    def _master_config(self, master: int) -> Path | None:
        """The configuration file the master says it runs (its title keeps the command line:
        ``nginx: master process /usr/sbin/nginx -p /srv/x/ -c /srv/x/nginx.conf``) when that is
        not this control's; None when it is, or when the title does not say (no ``-c``: the
        compiled-in default). A copy of a configuration (a checkout, a staging copy) whose
        ``pid`` path is the live one's reloaded the live nginx and made its pending edits live
        (a review)."""
        words = cmdline(master).split()
        if "-c" not in words[:-1]:
            return None
        conf = Path(words[words.index("-c") + 1])
        if not conf.is_absolute():
            if "-p" not in words[:-1]:
                return None  # (relative to a prefix the title does not give)
            conf = Path(words[words.index("-p") + 1]) / conf
        try:
            same = conf.resolve() == self.conf_path.resolve()
        except OSError:
            return None
        return None if same else conf

    def _apply(self, value: str | int | Sequence[str], res: ApplyResult) -> None:
        why = self._precheck()
        if not why:
            try:
                rest = self._original_rest() if isinstance(value, (str, int)) else None
            except ConfigEditError as e:
                why = str(e)
        if why:
            res.message = f"not touching the config: {why}"
            return
        res.stage = "edit"
        try:
            edit = config_edit.set_directive(self.conf_path, self.directive, value, server_name=self.server_name,
                                             backup_dir=self.backup_dir, refuse_shadowed=True, clamp_header=True,
                                             original_rest=rest, before_write=self._note_written)
        except ConfigEditError as e:
            res.message = f"edit refused, nothing written: {e}"
            return
        except OSError as e:  # (a file or directory it cannot write; the edit is atomic)
            res.message = f"edit failed, the config is unchanged: {e}"
            return
        res.edit = edit
        if not edit.changed:
            res.ok, res.stage, res.message = True, "unchanged", edit.message
            return
        try:
            self._make_live(edit, res)
        except Exception as e:  # noqa: BLE001 - whatever happened, the edit must not stay behind
            stage = res.stage
            try:
                self._rollback(res, reload=True)
            except Exception as e2:  # noqa: BLE001
                res.serving_last_good = False
                res.notes.append(f"rollback failed too: {e2!r}")
            res.ok = False
            res.message = f"unexpected error during {stage}: {e!r}; restored {edit.file}" if res.rolled_back else f"unexpected error during {stage}: {e!r}"

    def _make_live(self, edit: EditResult, res: ApplyResult) -> None:
        res.stage = "test"
        ok, msg = self.test()
        if not ok:
            self._rollback(res, reload=False)
            res.message = f"nginx -t rejected {edit.message}: {msg}; restored {edit.file}"
            return
        res.stage = "reload"
        res.reload = self.reload()
        if not res.reload.ok:
            # Without an [emerg] line the master may still be working on the new file:
            # re-signal after restoring so it ends up on the restored config.
            self._rollback(res, reload=not res.reload.emerg)
            res.message = f"reload failed ({res.reload.message}); restored {edit.file}"
            return
        if not res.reload.drained:
            res.notes.append(res.reload.message)
        res.stage = "health"
        if not self._healthy_within():
            self._rollback(res, reload=True)
            res.message = f"health check failed after applying {edit.message}; rolled back"
            return
        res.ok, res.stage, res.message = True, "done", edit.message

    def _rollback(self, res: ApplyResult, reload: bool) -> None:
        """Restore the pre-edit file; with ``reload``, make the restored config live again."""
        assert res.edit is not None
        config_edit.restore_backup(res.edit.file, self.backup_dir)
        res.rolled_back = True
        if not reload:
            # nginx never read the edit: the folder too as it last read it (its mtime is how a
            # file added or removed there is seen as pending)
            if res.edit.folder_times is not None:
                edited = res.edit.file.resolve() if res.edit.file.is_symlink() else res.edit.file
                try:
                    os.utime(edited.parent, ns=res.edit.folder_times)
                except OSError:
                    pass
            return
        ok, msg = self.test()
        if not ok:
            res.serving_last_good = False
            res.notes.append(f"restored config fails nginx -t ({msg}); nginx left on its current cycle")
            return
        res.rollback_reload = self.reload()
        if not res.rollback_reload.ok:
            res.serving_last_good = False
            res.notes.append(f"reload of the restored config failed: {res.rollback_reload.message}")
        elif not self._healthy_within():
            res.serving_last_good = False
            res.notes.append("health check still failing after rollback")
