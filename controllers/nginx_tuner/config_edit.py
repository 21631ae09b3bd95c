"""Change one directive's value in a real nginx configuration, touching exactly one line.

Why textual and not "parse, modify, build": ``crossplane.build`` re-renders the whole file,
losing the administrator's layout, comments and quoting, so a one-value change would show
up as a rewrite of the file in ``git diff``/etckeeper and in review. Here crossplane only
*locates* the directive (``crossplane.parse(path, comments=True, combine=False)`` gives the
file and line of every statement, following ``include``s), and the value is replaced in the
text of that one line. Absent directives are inserted as one new line right after the ``{``
of the scope block (``http``, or the ``server`` with a given ``server_name``), and the result
says so.

Safety net, in order:
- values are validated (no whitespace, quotes, ``;``, braces, ``#``, backslashes): an alert
  label or a sweep grid value is data, never config syntax;
- a directive whose arguments span several lines, or that appears twice in the same scope,
  is refused with a clear :class:`ConfigEditError` rather than guessed at;
- the new text is parsed again with crossplane (that file alone) and must equal the old
  statement list with only the intended change, or nothing is written;
- the write is atomic (``promreflex.fsutil.atomic_write_text``): a hidden temporary file in
  the same directory (hidden so an ``include dir/*`` glob, which skips dotfiles, never picks
  it up), ``fsync``, ``os.replace``, then the directory is fsync'd; mode and owner are kept.
  A crash leaves the old file or the new one, never half of one.
- the pre-edit content is copied to a backup directory first (default: a hidden
  ``.promreflex-backup`` folder beside the main config, again invisible to include globs;
  never a ``*.bak`` beside the file, which ``include sites-enabled/*`` would load as a second
  server). :class:`~controllers.nginx_tuner.nginx_ctl.NginxControl` only edits a config that
  passed ``nginx -t`` and is being served, so that backup is the last good config.

Scopes and what is in force (:func:`effective_directive`): a named server's value is its own,
else the ``http`` block's, else nginx's built-in default. An edit of a scope does not reach
traffic served by a ``server``/``location`` below it that sets its own value: those are listed
in ``EditResult.shadowed_by``, and ``set_directive(..., refuse_shadowed=True)`` (what
``NginxControl`` uses) or :func:`check_tunable` refuses instead, naming each file:line, before
anything is written: tune that server (``--nginx.server-name``) or remove the override. We
refuse rather than edit the overrides too: they are the administrator's deliberate choices.
A file that several ``include``s load (a shared snippet) is never edited: the change would
reach every includer; the error names them.

Reading text as nginx does: a quote starts a quoted token only at the start of a token, a
``*_by_lua_block`` body is one token (crossplane's Lua extension's rules), quoted arguments are
compared without their quotes, and an insert goes after the ``{`` of the scope's own statement
even when another block shares its line (``events { ... } http {``); the re-parse check also
requires the inserted statement to sit directly in that block. A definition that the parse
puts inside a block where nginx allows none (crossplane's Lua lexer counts braces inside Lua
long strings, so what follows ``[[ } { ]]`` lands in a block that does not exist) makes every
lookup raise instead of reporting the value absent and inserting a second one.

Only the first file a directive lives in is changed; the caller (``NginxControl``) runs
``nginx -t`` on the whole tree afterwards, which is the real validator.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crossplane

from promreflex.fsutil import atomic_write_text

INSERT_COMMENT = "# added by promreflex nginx_tuner"
DEFAULT_BACKUP_DIRNAME = ".promreflex-backup"

# One nginx argument we are willing to write: a bare word. Quoting/escaping rules differ
# between directives, so anything needing them is refused instead of escaped.
_SAFE_ARG = re.compile(r"^[A-Za-z0-9_.:/@%+=,$-]+$")

# Tokenizer for locating a statement's columns (crossplane reports lines, not columns).
# nginx's rules: a quote starts a quoted token only at the start of a token (``don't`` is one
# word), ``#`` starts a comment only at the start of a token (``c#d`` is one word).
_TOKEN = re.compile(
    r"""
      (?P<ws>\s+)
    | (?P<comment>\#[^\n]*)
    | (?P<quoted>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')
    | (?P<punct>[;{}])
    | (?P<word>(?:\\.|\$\{[^}\s]*\}|[^\s;{}"'\\])(?:\\.|\$\{[^}\s]*\}|[^\s;{}\\])*)
    """,
    re.VERBOSE | re.DOTALL,
)


class ConfigEditError(Exception):
    """The edit could not be made safely; the file was left untouched."""


class ShadowedError(ConfigEditError):
    """The directive is set again in a server/location below the scope being tuned, so an edit
    of the scope would not reach (all of) its traffic; nothing was written."""


@dataclass(frozen=True)
class Token:
    kind: str  # quoted | punct | word  (whitespace and comments are dropped)
    text: str
    start: int
    end: int
    line: int


@dataclass(frozen=True)
class Location:
    """Where a directive is, as crossplane saw it."""

    file: Path
    line: int
    args: tuple[str, ...]


@dataclass(frozen=True)
class EditResult:
    """What :func:`set_directive` did."""

    file: Path
    line: int
    directive: str
    old_args: tuple[str, ...] | None  # None: the directive was absent and got inserted
    new_args: tuple[str, ...]
    inserted: bool
    changed: bool  # False when the value was already set (nothing written)
    backup: Path | None
    shadowed_by: tuple[Location, ...] = field(default=())  # nested scopes redefining it
    message: str = ""
    # (access, modification) times in ns of the folder the file was written in, before the edit
    # made its temporary files there: a rollback nginx never had to reload gives them back
    # (NginxControl.pending_files watches the folders of wildcard includes).
    folder_times: tuple[int, int] | None = None


# ---------------------------------------------------------------------------- parsing


def _parse(conf_path: Path, single: bool = False) -> list[dict[str, Any]]:
    payload = crossplane.parse(
        str(conf_path),
        comments=True,
        combine=False,
        single=single,
        check_ctx=False,  # nginx -t is the real validator; crossplane's tables lag nginx
        check_args=False,
    )
    if payload["status"] != "ok":
        errs = "; ".join(f"{e.get('file')}:{e.get('line')}: {e.get('error')}" for e in payload["errors"])
        raise ConfigEditError(f"cannot parse {conf_path}: {errs}")
    return payload["config"]


def _children(stmts: list[dict], file: str, configs: list[dict]) -> Iterator[tuple[str, dict]]:
    """Direct children of a block as nginx sees them: ``include``s are expanded in place."""
    for stmt in stmts:
        if stmt["directive"] == "#":
            continue
        if stmt["directive"] == "include" and "includes" in stmt:
            for idx in stmt["includes"]:
                yield from _children(configs[idx]["parsed"], configs[idx]["file"], configs)
        else:
            yield file, stmt


def _descendants(stmts: list[dict], file: str, configs: list[dict]) -> Iterator[tuple[str, dict]]:
    for f, stmt in _children(stmts, file, configs):
        yield f, stmt
        if "block" in stmt:
            yield from _descendants(stmt["block"], f, configs)


def _http(configs: list[dict]) -> tuple[str, dict]:
    main = configs[0]
    https = [(f, s) for f, s in _children(main["parsed"], main["file"], configs) if s["directive"] == "http"]
    if len(https) != 1:
        raise ConfigEditError(f"expected exactly one http block in {main['file']}, found {len(https)}")
    return https[0]


def _find_scope(configs: list[dict], server_name: str | None) -> tuple[str, dict]:
    """The ``http`` block, or the ``server`` in it whose ``server_name`` lists the name."""
    http_file, http = _http(configs)
    if server_name is None:
        return http_file, http
    servers = [
        (f, s)
        for f, s in _children(http["block"], http_file, configs)
        if s["directive"] == "server"
        # (nginx compares host names without regard to case)
        and any(c["directive"] == "server_name" and server_name.lower() in (a.lower() for a in c["args"])
                for _, c in _children(s["block"], f, configs))
    ]
    if len(servers) != 1:
        where = " (" + ", ".join(f"{f}:{s['line']}" for f, s in servers) + ")" if servers else ""
        raise ConfigEditError(f"expected exactly one server with server_name {server_name!r}, found {len(servers)}{where}")
    return servers[0]


#: Blocks below ``http`` where an http-core directive such as ``keepalive_timeout`` can be set
#: again for part of the traffic. (``upstream { keepalive_timeout }`` is the upstream module's
#: own directive, the idle time of cached connections to the backends, not a redefinition.)
_OVERRIDE_BLOCKS = ("server", "location")


def _overrides(stmts: list[dict], file: str, configs: list[dict], directive: str) -> Iterator[tuple[str, dict]]:
    """Definitions of ``directive`` in the ``server``/``location`` blocks nested below ``stmts``."""
    for f, child in _children(stmts, file, configs):
        if child["directive"] in _OVERRIDE_BLOCKS and "block" in child:
            for g, s in _children(child["block"], f, configs):
                if s["directive"] == directive:
                    yield g, s
            yield from _overrides(child["block"], f, configs, directive)


def _includers(configs: list[dict], file: str) -> list[tuple[str, int]]:
    """Every ``include`` (file, line) that loads ``file``: crossplane parses a file once, however
    many places include it, so one edit there reaches all of them. Once per spelling of its
    path, though (``snippets/x.conf``, ``./snippets/x.conf``, a linked folder): every entry of
    the same real file counts (it took two spellings for a shared snippet to pass as not shared,
    and tuning one server rewrote the other's value at every trial: a review)."""
    real = os.path.realpath(file)
    idx = {i for i, c in enumerate(configs) if os.path.realpath(c["file"]) == real}
    found: list[tuple[str, int]] = []

    def walk(stmts: list[dict], f: str) -> None:
        for st in stmts:
            if st["directive"] == "include" and idx.intersection(st.get("includes", ())):
                found.append((f, st["line"]))
            walk(st.get("block", []), f)

    for c in configs:
        walk(c["parsed"], c["file"])
    return found


def _locate(
    conf_path: Path, directive: str, server_name: str | None
) -> tuple[list[dict], tuple[str, dict], list[tuple[str, dict]], list[tuple[str, dict]]]:
    """(configs, scope, direct definitions in the scope, definitions in its nested server/location blocks)."""
    configs = _parse(conf_path)
    scope_file, scope = _find_scope(configs, server_name)
    direct = [(f, s) for f, s in _children(scope["block"], scope_file, configs) if s["directive"] == directive]
    nested = list(_overrides(scope["block"], scope_file, configs, directive))
    stray = list(_stray(scope["block"], scope_file, configs, directive))
    if stray:
        where = ", ".join(f"{f}:{s['line']} (inside '{parent}')" for f, s, parent in stray)
        raise ConfigEditError(
            f"{directive} found where nginx does not allow it: {where}; the config is probably misread (a brace "
            "inside a Lua long string or comment of a *_by_lua_block is one known cause); refusing to guess"
        )
    return configs, (scope_file, scope), direct, nested


#: Blocks that may hold an http-level directive as crossplane reads a valid config (``if`` is
#: not allowed for ``keepalive_timeout`` but nginx -t says so itself; ``upstream`` has its own).
_KNOWN_PARENTS = frozenset({"http", "server", "location", "upstream", "if", "limit_except"})


def _stray(stmts: list[dict], file: str, configs: list[dict], directive: str) -> Iterator[tuple[str, dict, str]]:
    """``directive`` inside blocks no valid config puts it in (a sign the text was misread)."""
    for f, child in _children(stmts, file, configs):
        if "block" not in child:
            continue
        for g, st in _children(child["block"], f, configs):
            if st["directive"] == directive and child["directive"] not in _KNOWN_PARENTS:
                yield g, st, child["directive"]
        yield from _stray(child["block"], f, configs, directive)


def get_directive(conf_path: str | os.PathLike, directive: str, server_name: str | None = None) -> Location | None:
    """Where ``directive`` is set directly in the scope (``http`` or the named server), or None.

    This is what :func:`set_directive` edits, not necessarily the value in force: see
    :func:`effective_directive`."""
    _, _, direct, _ = _locate(Path(conf_path), directive, server_name)
    if len(direct) > 1:
        where = ", ".join(f"{f}:{s['line']}" for f, s in direct)
        raise ConfigEditError(f"{directive} is set {len(direct)} times in the same scope ({where})")
    if not direct:
        return None
    f, s = direct[0]
    return Location(Path(f), s["line"], tuple(s["args"]))


def effective_directive(conf_path: str | os.PathLike, directive: str, server_name: str | None = None) -> Location | None:
    """The definition in force for the scope (``http`` or the named server): the nearest one
    going up (the server's own, else the ``http`` block's), or None when neither sets it and
    nginx's built-in default applies (75 s for ``keepalive_timeout``)."""
    conf = Path(conf_path)
    own = get_directive(conf, directive, server_name)
    if own is not None or server_name is None:
        return own
    return get_directive(conf, directive, None)


def _scope_label(server_name: str | None) -> str:
    return f"server {server_name}" if server_name else "http"


def _shadow_error(directive: str, server_name: str | None, shadowed: Sequence[Location]) -> ConfigEditError:
    where = ", ".join(dict.fromkeys(f"{loc.file}:{loc.line} ({directive} {' '.join(loc.args)})" for loc in shadowed))
    if server_name is None:
        fix = "tune that server instead (--nginx.server-name) or remove the override"
        what = "a value set in http does not reach the traffic of the servers/locations that set their own"
    else:
        fix = "remove the override from the location (or tune with it in mind)"
        what = f"a value set in server {server_name} does not reach the traffic of its locations that set their own"
    return ShadowedError(f"refusing to tune {directive} in {_scope_label(server_name)}: it is set again at {where}; {what}; {fix}")


def check_tunable(conf_path: str | os.PathLike, directive: str, server_name: str | None = None) -> None:
    """Raise :class:`ConfigEditError` when :func:`set_directive` with ``refuse_shadowed`` would
    refuse for reasons of the configuration's layout (ambiguous server, override below the
    scope, a snippet included elsewhere too), without editing anything."""
    configs, (scope_file, _), direct, nested = _locate(Path(conf_path), directive, server_name)
    _refusals(configs, scope_file, direct, nested, directive, server_name, refuse_shadowed=True)


def _refusals(
    configs: list[dict], scope_file: str, direct: list[tuple[str, dict]], nested: list[tuple[str, dict]],
    directive: str, server_name: str | None, refuse_shadowed: bool,
) -> None:
    """The layout refusals shared by :func:`check_tunable` and :func:`set_directive`: the
    directive set twice in the scope, an override below it (only with ``refuse_shadowed``),
    a file several ``include``s load."""
    if len(direct) > 1:
        where = ", ".join(f"{f}:{s['line']}" for f, s in direct)
        raise ConfigEditError(f"{directive} is set {len(direct)} times in {_scope_label(server_name)} ({where}); refusing to guess")
    if nested and refuse_shadowed:
        raise _shadow_error(directive, server_name, [Location(Path(f), s["line"], tuple(s["args"])) for f, s in nested])
    _check_shared(configs, direct[0][0] if direct else scope_file, directive, server_name)


def _check_shared(configs: list[dict], file: str, directive: str, server_name: str | None) -> None:
    """Refuse to edit a file that more than one ``include`` loads (a shared snippet): the edit
    would change every place that includes it, not only the scope being tuned."""
    inc = _includers(configs, file)
    if len(inc) > 1:
        where = ", ".join(f"{f}:{line}" for f, line in inc)
        raise ConfigEditError(
            f"refusing to edit {file}: it is included {len(inc)} times ({where}), so changing {directive} there would "
            f"change every one of those places, not only {_scope_label(server_name)}; move {directive} out of the "
            "shared file into the blocks that include it, then tune"
        )


def config_files(conf_path: str | os.PathLike) -> list[Path]:
    """Every file the configuration reads as configuration (``conf_path`` and its ``include``s)."""
    return [Path(c["file"]) for c in _parse(Path(conf_path))]


def watched_paths(conf_path: str | os.PathLike) -> list[Path]:
    """The paths whose change changes what nginx reads, from one parse: every file the
    configuration reads, and the folders of its wildcard ``include``s (``sites-enabled/*``: a
    file added or removed there)."""
    conf = Path(conf_path)
    configs = _parse(conf)
    folders: dict[Path, None] = {}
    for c in configs:
        stack = list(c["parsed"])
        while stack:
            stmt = stack.pop()
            stack.extend(stmt.get("block", ()))
            if stmt["directive"] == "include" and stmt["args"] and any(ch in stmt["args"][0] for ch in "*?["):
                pattern = Path(stmt["args"][0])
                folders.setdefault((pattern if pattern.is_absolute() else conf.parent / pattern).parent, None)
    return [*(Path(c["file"]) for c in configs), *folders]


def target_file(conf_path: str | os.PathLike, directive: str, server_name: str | None = None) -> Path:
    """The one file :func:`set_directive` would write: the file holding the directive in the
    scope, else the file holding the scope's block (where it would be inserted)."""
    _, (scope_file, _), direct, _ = _locate(Path(conf_path), directive, server_name)
    return Path(direct[0][0] if direct else scope_file)


def main_args(conf_path: str | os.PathLike, directive: str) -> list[tuple[str, ...]]:
    """Arguments of every main-context ``directive`` (e.g. ``pid``, ``error_log``), in order."""
    configs = _parse(Path(conf_path))
    main = configs[0]
    return [tuple(s["args"]) for _, s in _children(main["parsed"], main["file"], configs) if s["directive"] == directive]


# -------------------------------------------------------------------------- text edits


#: OpenResty directives whose ``{ ... }`` is Lua code, read as one argument (as crossplane's
#: Lua extension reads it: its rules are followed here so both see the same statements).
LUA_BLOCKS = frozenset({
    "access_by_lua_block", "balancer_by_lua_block", "body_filter_by_lua_block", "content_by_lua_block",
    "header_filter_by_lua_block", "init_by_lua_block", "init_worker_by_lua_block", "log_by_lua_block",
    "rewrite_by_lua_block", "set_by_lua_block", "ssl_certificate_by_lua_block", "ssl_session_fetch_by_lua_block",
    "ssl_session_store_by_lua_block",
})


def _skip_lua_block(text: str, pos: int, directive: str, line: int) -> int:
    """End (exclusive) of a ``*_by_lua_block``'s body starting at ``pos`` (just after the
    directive and the blank that ended it), following crossplane's Lua lexer: ``--`` comments
    run to the end of the line, quoted strings are skipped, other braces are counted."""
    n = len(text)

    def fail(why: str) -> ConfigEditError:
        return ConfigEditError(f"cannot read the {directive} near line {line}: {why}")

    if directive == "set_by_lua_block":  # its one argument comes before the block
        while pos < n and text[pos].isspace():
            pos += 1
        while pos < n and not text[pos].isspace():
            pos += 2 if text[pos] == "\\" else 1
    while pos < n and text[pos].isspace():
        pos += 1
    if pos >= n or text[pos] != "{":
        raise fail("expected { to start the Lua block")
    depth, i = 1, pos + 1
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "-" and text.startswith("--", i):
            while i < n and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
        elif c in "\"'":
            i += 1
            while i < n and text[i] != c:
                i += 2 if text[i] == "\\" else 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise fail("unbalanced braces")


def tokenize(text: str) -> list[Token]:
    """Significant tokens with offsets and 1-based lines; raises on text nginx would reject.

    A ``*_by_lua_block`` body (braces included) is one ``lua`` token followed by a ``;``
    token of zero width, which is how crossplane's Lua extension reports it.
    """
    tokens: list[Token] = []
    pos, line = 0, 1
    expect_directive = True
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ConfigEditError(f"cannot tokenize near line {line}: {text[pos:pos + 20]!r}")
        kind = m.lastgroup or ""
        if kind in ("quoted", "punct", "word"):
            tokens.append(Token(kind, m.group(), m.start(), m.end(), line))
        line += m.group().count("\n")
        pos = m.end()
        if kind == "punct":
            expect_directive = True
        elif kind in ("quoted", "word"):
            name = _unquote(tokens[-1])
            # (crossplane hands a bare word to the Lua lexer at the blank after it, a quoted one at once)
            lua = expect_directive and name in LUA_BLOCKS and (kind == "quoted" or (pos < len(text) and text[pos].isspace()))
            expect_directive = False
            if lua:
                end = _skip_lua_block(text, pos, name, line)
                body_start = pos
                tokens.append(Token("lua", text[body_start:end], body_start, end, line))
                line += text.count("\n", body_start, end)
                tokens.append(Token("punct", ";", end, end, line))
                pos, expect_directive = end, True
    return tokens


def _unquote(tok: Token) -> str:
    """A token's value as crossplane reports it: quotes removed, an escaped quote of the same
    kind unescaped (other escapes are kept as written)."""
    if tok.kind != "quoted":
        return tok.text
    q = tok.text[0]
    return tok.text[1:-1].replace("\\" + q, q)


def _statement_starts(tokens: list[Token]) -> list[int]:
    """Indexes of tokens that begin a statement (after ``;``, ``{``, ``}`` or at the start)."""
    starts, expect = [], True
    for i, tok in enumerate(tokens):
        if tok.kind == "punct":
            expect = True
        elif expect:
            starts.append(i)
            expect = False
    return starts


def _occurrence_index(parsed: list[dict], target: dict) -> int:
    """Among statements of one file with target's name and line, which one (textual order)."""
    same: list[dict] = []

    def walk(stmts: list[dict]) -> None:
        for s in stmts:
            if s["directive"] == target["directive"] and s["line"] == target["line"]:
                same.append(s)
            walk(s.get("block", []))

    walk(parsed)
    return next(i for i, s in enumerate(same) if s is target)


def _validate_args(args: Sequence[str]) -> tuple[str, ...]:
    out = tuple(str(a) for a in args)
    if not out:
        raise ConfigEditError("a directive needs at least one argument")
    for a in out:
        if not _SAFE_ARG.match(a):
            raise ConfigEditError(f"refusing argument {a!r}: only bare words [A-Za-z0-9_.:/@%+=,$-] are written")
    return out


_TIME_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "M": 2592000, "y": 31536000}
_TIME_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|M|y)?")


def nginx_seconds(text: str) -> float:
    """nginx time syntax to seconds: ``75`` and ``75s`` -> 75.0, ``1m30s`` -> 90.0, ``500ms`` -> 0.5."""
    pos, total = 0, 0.0
    while pos < len(text):
        m = _TIME_PART.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"not an nginx time: {text!r}")
        total += int(m.group(1)) * _TIME_UNITS[m.group(2) or "s"]
        pos = m.end()
    if not text:
        raise ValueError("empty nginx time")
    return total


def _clamped_header(directive: str, new_first: str, rest: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """``keepalive_timeout T H``: H (the ``Keep-Alive: timeout=H`` header) must not exceed T,
    or clients reuse connections nginx has already closed. (rest, note) with H lowered to T.

    ``rest`` is the administrator's H (see ``original_rest`` of :func:`set_directive`), not a
    previous edit's: the result is min(H, T), so a trial's lowered header never sticks."""
    if directive != "keepalive_timeout" or not rest:
        return rest, ""
    try:
        over = nginx_seconds(rest[0]) > nginx_seconds(new_first)
    except ValueError:
        return rest, ""
    if not over:
        return rest, ""
    note = f"; the Keep-Alive header timeout {rest[0]} was lowered to {new_first} (it must not exceed the timeout)"
    return (new_first, *rest[1:]), note


def _replace_args(
    text: str, directive: str, line: int, occurrence: int, value: str | Sequence[str], clamp_header: bool = False,
    original_rest: Sequence[str] | None = None,
) -> tuple[str, tuple[str, ...], tuple[str, ...], str]:
    """(new text, old args as crossplane reads them, new args, note on a lowered header timeout)."""
    tokens = tokenize(text)
    starts = [i for i in _statement_starts(tokens) if tokens[i].line == line and _unquote(tokens[i]) == directive]
    if occurrence >= len(starts):
        raise ConfigEditError(f"{directive} not found on line {line} (tokenizer and crossplane disagree)")
    i = starts[occurrence]
    j = i + 1
    while j < len(tokens) and tokens[j].text != ";":
        if tokens[j].kind == "punct":
            raise ConfigEditError(f"{directive} on line {line} is not a simple statement")
        j += 1
    if j >= len(tokens) or tokens[j].line != line:
        raise ConfigEditError(f"{directive} on line {line} spans several lines; refusing a multi-line edit")
    arg_tokens = tokens[i + 1 : j]
    if not arg_tokens:
        raise ConfigEditError(f"{directive} on line {line} has no arguments")
    old_args = tuple(_unquote(t) for t in arg_tokens)  # compared with crossplane's, which has no quotes
    note = ""
    if isinstance(value, str):
        # One value: replace the first argument only (keepalive_timeout's optional second
        # argument, the Keep-Alive header timeout, is the administrator's choice; with
        # ``clamp_header`` it is lowered to the new value when it would exceed it). The other
        # arguments are the administrator's (``original_rest``) when given, else the file's.
        new_first = _validate_args([value])
        rest = old_args[1:] if original_rest is None else tuple(original_rest)
        if clamp_header:
            rest, note = _clamped_header(directive, new_first[0], rest)
        new_args = new_first + rest
        if rest == old_args[1:]:  # the other arguments stay as written (quotes and all)
            start, end = arg_tokens[0].start, arg_tokens[0].end
            replacement = new_first[0]
        else:
            if not note:
                was = " ".join(old_args[1:]) or "none"
                note = f"; the Keep-Alive header timeout {was} was set back to {' '.join(rest) or 'none'} (as configured before tuning)"
            start, end = arg_tokens[0].start, arg_tokens[-1].end
            replacement = " ".join(new_first + (_validate_args(rest) if rest else ()))
    else:
        new_args = _validate_args(value)
        start, end = arg_tokens[0].start, arg_tokens[-1].end
        replacement = " ".join(new_args)
    return text[:start] + replacement + text[end:], old_args, new_args, note


def _insert_line(
    text: str, block: str, block_line: int, occurrence: int, directive: str, args: tuple[str, ...]
) -> tuple[str, int]:
    """Insert ``directive args;`` as a new line right after the block's opening brace line.

    The block is the ``occurrence``-th statement named ``block`` starting on ``block_line``
    (crossplane's line; the tokenizer finds that statement and the ``{`` that opens it, so a
    line such as ``events { ... } http {`` gets the insert in ``http``, not in ``events``).
    Returns the new text and the 1-based line that now holds the statement.
    """
    tokens = tokenize(text)
    starts = [i for i in _statement_starts(tokens) if tokens[i].line == block_line and _unquote(tokens[i]) == block]
    if occurrence >= len(starts):
        raise ConfigEditError(f"no {block} block found on line {block_line} (tokenizer and crossplane disagree)")
    k = starts[occurrence] + 1
    while k < len(tokens) and tokens[k].kind != "punct":
        k += 1
    if k >= len(tokens) or tokens[k].text != "{":
        raise ConfigEditError(f"no '{{' found for the {block} block at line {block_line}")
    brace = tokens[k]
    depth = 0
    for t in tokens:
        if t.line != brace.line or t.start < brace.start:
            continue
        depth += {"{": 1, "}": -1}.get(t.text, 0)
        if depth == 0:
            # A one-line block (``server { listen 80; }``): a new line after it would land
            # outside the block, so put the statement inside, right after the brace.
            stmt = f" {directive} {' '.join(args)};"
            return text[: brace.end] + stmt + text[brace.end :], brace.line
    lines = text.splitlines(keepends=True)
    brace_text = lines[brace.line - 1]
    eol = brace_text[len(brace_text.rstrip("\r\n")) :] or "\n"
    block_indent = _indent(lines[block_line - 1])
    indent = block_indent + "    "
    for nxt in lines[brace.line :]:
        if nxt.strip():
            cand = _indent(nxt)
            if len(cand) > len(block_indent):
                indent = cand
            break
    new_line = f"{indent}{directive} {' '.join(args)};  {INSERT_COMMENT}{eol}"
    lines.insert(brace.line, new_line)
    return "".join(lines), brace.line + 1


def _flat(parsed: list[dict], depth: int = 0) -> list[tuple[int, str, tuple[str, ...]]]:
    out: list[tuple[int, str, tuple[str, ...]]] = []
    for s in parsed:
        if s["directive"] == "#":
            continue
        out.append((depth, s["directive"], tuple(s["args"])))
        out.extend(_flat(s.get("block", []), depth + 1))
    return out


def _flat_index(parsed: list[dict], target: dict) -> int:
    """Position of ``target`` (a statement of ``parsed``, by identity) in :func:`_flat` order."""
    order: list[dict] = []

    def walk(stmts: list[dict]) -> None:
        for st in stmts:
            if st["directive"] == "#":
                continue
            order.append(st)
            walk(st.get("block", []))

    walk(parsed)
    return next(i for i, st in enumerate(order) if st is target)


def _parent(flat: list[tuple[int, str, tuple[str, ...]]], k: int) -> int | None:
    """Index in ``flat`` of the block statement holding entry ``k`` (None at the top level)."""
    depth = flat[k][0]
    return next((i for i in range(k - 1, -1, -1) if flat[i][0] == depth - 1), None)


def _verify(
    old_path: Path, new_path: Path, directive: str, old_args: tuple[str, ...] | None, new_args: tuple[str, ...],
    parent: int | None = None,
) -> None:
    """Parse the new file alone; it must be the old statement list with only our change.
    For an insert, ``parent`` is the scope block's index in the old file's :func:`_flat` list:
    the new statement must sit directly in that block."""
    old = _flat(_parse(old_path, single=True)[0]["parsed"])
    new = _flat(_parse(new_path, single=True)[0]["parsed"])
    if old_args is not None:
        diffs = [(a, b) for a, b in zip(old, new, strict=False) if a != b] if len(old) == len(new) else []
        ok = len(diffs) == 1 and diffs[0][0][1:] == (directive, old_args) and diffs[0][1][1:] == (directive, new_args)
    else:
        ok = len(new) == len(old) + 1 and any(
            new[k][1:] == (directive, new_args) and new[:k] + new[k + 1 :] == old and _parent(new, k) == parent
            for k in range(len(new))
        )
    if not ok:
        raise ConfigEditError(f"re-parsing the edited {old_path} did not give exactly the intended change; nothing written")


# ----------------------------------------------------------------------------- writes


def read_text(path: Path) -> str:
    """File text with its line endings untouched (CRLF files stay CRLF)."""
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            return fh.read()
    except UnicodeDecodeError as e:
        raise ConfigEditError(f"{path} is not UTF-8 text ({e}); refusing to rewrite it") from e


def backup_path(file: Path, backup_dir: Path) -> Path:
    """Backup name for ``file``: its absolute path flattened, so two ``default.conf`` never clash."""
    return backup_dir / str(file.resolve()).strip("/").replace("/", "__")


def atomic_write(path: Path, text: str, like: Path | None = None) -> None:
    """Replace ``path`` atomically with ``text``, keeping mode and owner of ``like`` (or of ``path``).

    A symbolic link is followed, not replaced: ``sites-enabled/shop -> ../sites-available/shop``
    stays a link and the file it names gets the new text (replacing the link with a file would
    fork the config: nginx runs one copy, the operator edits the other).

    :func:`promreflex.fsutil.atomic_write_text` does the work: a hidden ``.name.XXXX.tmp`` in the
    same folder (so ``include dir/*`` globs never see it), mode and owner set on it before the
    rename, fsync, rename, folder fsync. A config deployed as ``deploy:www-data`` while we run as
    root keeps its owner, and a crash leaves the old file or the new one, never half of one.
    """
    target = path.resolve() if path.is_symlink() else path
    atomic_write_text(target, text, like=like if like is not None else target)


def save_backup(file: Path, backup_dir: Path) -> Path:
    """Copy ``file`` into ``backup_dir`` atomically (same mode/owner); return the copy's path."""
    backup_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    dest = backup_path(file, backup_dir)
    st = file.stat()
    atomic_write(dest, read_text(file), like=file)
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))  # (restore_backup gives it back)
    return dest


def restore_backup(file: Path, backup_dir: Path) -> None:
    """Put the backed-up content of ``file`` back, atomically, keeping the live file's mode/owner
    and giving it back its modification time from before the edit."""
    src = backup_path(file, backup_dir)
    if not src.exists():
        raise ConfigEditError(f"no backup of {file} in {backup_dir}")
    atomic_write(file, read_text(src))
    # The file's time as well as its text: a rollback that nginx never needed to reload (the
    # edit failed nginx -t) leaves the file as nginx last read it, not an edit pending a reload
    # (NginxControl.pending_files).
    st = src.stat()
    os.utime(file.resolve() if file.is_symlink() else file, ns=(st.st_atime_ns, st.st_mtime_ns))


def _indent(line: str) -> str:
    """The leading blanks of ``line``."""
    return line[: len(line) - len(line.lstrip(" \t"))]


def set_directive(
    conf_path: str | os.PathLike,
    directive: str,
    value: str | int | Sequence[str],
    *,
    server_name: str | None = None,
    backup_dir: str | os.PathLike | None = None,
    refuse_shadowed: bool = False,
    clamp_header: bool = False,
    original_rest: Sequence[str] | None = None,
    before_write: Callable[[Path, str], None] | None = None,
) -> EditResult:
    """Set ``directive`` in the ``http`` block (or the ``server`` named ``server_name``).

    ``value``: a string or int replaces the first argument only (other arguments kept); a
    sequence replaces all arguments. The one file holding the directive (possibly an included
    one) is rewritten with exactly one line changed, or one line inserted after the scope's
    ``{`` when the directive is absent. Raises :class:`ConfigEditError` and writes nothing
    when that cannot be done safely, which includes a file that several ``include``s load (a
    snippet shared with other servers: the edit would change them too; move the directive into
    the scope's block itself first).

    Definitions in ``server``/``location`` blocks below the scope (``upstream``'s own
    ``keepalive_timeout`` is another directive and does not count) are returned in
    ``shadowed_by``; with ``refuse_shadowed`` (what :class:`~.nginx_ctl.NginxControl` uses)
    they make it raise :class:`ShadowedError` instead, naming them, before anything is written:
    the edit would not reach the traffic they serve. With ``clamp_header`` a
    ``keepalive_timeout``'s second argument (the Keep-Alive header timeout) is lowered to the
    new first one when it would exceed it, and the message says so. ``original_rest``: the
    arguments after the first as the administrator configured them, before any tuning edit
    (``()`` for none); a one-value edit writes those (with ``clamp_header``, the header as
    min(that header, new value)) instead of the file's current ones, so a lowered header is
    raised back when a later value allows it. None: the file's current ones.
    """
    conf = Path(conf_path)
    bdir = Path(backup_dir) if backup_dir is not None else conf.parent / DEFAULT_BACKUP_DIRNAME
    if isinstance(value, int):
        value = str(value)
    configs, (scope_file, scope), direct, nested = _locate(conf, directive, server_name)
    _refusals(configs, scope_file, direct, nested, directive, server_name, refuse_shadowed)
    shadowed = tuple(Location(Path(f), s["line"], tuple(s["args"])) for f, s in nested)
    scope_name = _scope_label(server_name)

    parent: int | None = None
    if direct:
        file_s, stmt = direct[0]
        file = Path(file_s)
        parsed = next(c["parsed"] for c in configs if c["file"] == file_s)
        text = read_text(file)
        new_text, old_args, new_args, note = _replace_args(
            text, directive, stmt["line"], _occurrence_index(parsed, stmt), value, clamp_header, original_rest
        )
        line, inserted = stmt["line"], False
        if new_args == old_args:
            msg = f"{directive} already {' '.join(new_args)} in {file}:{line}"
            return EditResult(file, line, directive, old_args, new_args, False, False, None, shadowed, msg)
        msg = f"{directive} {' '.join(old_args)} -> {' '.join(new_args)} in {file}:{line}{note}"
    else:
        file = Path(scope_file)
        new_args = _validate_args([value] if isinstance(value, str) else value)
        note = ""
        if isinstance(value, str) and original_rest:
            # The scope inherits a header timeout (http's ``keepalive_timeout 65 60``): written
            # with the value, lowered to it, or nginx goes on advertising the inherited one.
            rest, note = _clamped_header(directive, new_args[0], tuple(original_rest)) if clamp_header else (
                tuple(original_rest), "")
            new_args = new_args + _validate_args(list(rest))
        text = read_text(file)
        parsed = next(c["parsed"] for c in configs if c["file"] == scope_file)
        new_text, line = _insert_line(text, scope["directive"], scope["line"], _occurrence_index(parsed, scope), directive, new_args)
        parent = _flat_index(parsed, scope)
        old_args, inserted = None, True
        msg = f"{directive} was absent from {scope_name}; inserted '{directive} {' '.join(new_args)};' at {file}:{line}{note}"
    if shadowed:
        msg += "; note: redefined in nested blocks at " + ", ".join(f"{loc.file}:{loc.line}" for loc in shadowed)

    # Verify on a private copy, then back up and swap in atomically.
    written = file.resolve() if file.is_symlink() else file
    folder = os.stat(written.parent)
    fd, probe = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".verify")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(new_text)
        _verify(file, Path(probe), directive, old_args, new_args, parent)
    finally:
        os.unlink(probe)
    backup = save_backup(file, bdir)
    if before_write is not None:  # (a sweep's journal notes what it is about to write)
        before_write(file, new_text)
    atomic_write(file, new_text)
    return EditResult(file, line, directive, old_args, new_args, inserted, True, backup, shadowed, msg,
                      (folder.st_atime_ns, folder.st_mtime_ns))
