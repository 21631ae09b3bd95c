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

Only the first file a directive lives in is changed; the caller (``NginxControl``) runs
``nginx -t`` on the whole tree afterwards, which is the real validator.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator, Sequence
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
_TOKEN = re.compile(
    r"""
      (?P<ws>\s+)
    | (?P<comment>\#[^\n]*)
    | (?P<quoted>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')
    | (?P<punct>[;{}])
    | (?P<word>(?:\\.|\$\{[^}\s]*\}|[^\s;{}"'\\])+)
    """,
    re.VERBOSE | re.DOTALL,
)


class ConfigEditError(Exception):
    """The edit could not be made safely; the file was left untouched."""


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


def _find_scope(configs: list[dict], server_name: str | None) -> tuple[str, dict]:
    """The ``http`` block, or the ``server`` in it whose ``server_name`` lists the name."""
    main = configs[0]
    https = [(f, s) for f, s in _children(main["parsed"], main["file"], configs) if s["directive"] == "http"]
    if len(https) != 1:
        raise ConfigEditError(f"expected exactly one http block in {main['file']}, found {len(https)}")
    http_file, http = https[0]
    if server_name is None:
        return http_file, http
    servers = [
        (f, s)
        for f, s in _children(http["block"], http_file, configs)
        if s["directive"] == "server"
        and any(c["directive"] == "server_name" and server_name in c["args"] for _, c in _children(s["block"], f, configs))
    ]
    if len(servers) != 1:
        raise ConfigEditError(f"expected exactly one server with server_name {server_name!r}, found {len(servers)}")
    return servers[0]


def _locate(
    conf_path: Path, directive: str, server_name: str | None
) -> tuple[list[dict], tuple[str, dict], list[tuple[str, dict]], list[tuple[str, dict]]]:
    configs = _parse(conf_path)
    scope_file, scope = _find_scope(configs, server_name)
    direct = [(f, s) for f, s in _children(scope["block"], scope_file, configs) if s["directive"] == directive]
    nested = [
        (f, s)
        for f, child in _children(scope["block"], scope_file, configs)
        if "block" in child
        for f, s in _descendants(child["block"], f, configs)
        if s["directive"] == directive
    ]
    return configs, (scope_file, scope), direct, nested


def get_directive(conf_path: str | os.PathLike, directive: str, server_name: str | None = None) -> Location | None:
    """Where ``directive`` is set directly in the scope (``http`` or the named server), or None."""
    _, _, direct, _ = _locate(Path(conf_path), directive, server_name)
    if len(direct) > 1:
        where = ", ".join(f"{f}:{s['line']}" for f, s in direct)
        raise ConfigEditError(f"{directive} is set {len(direct)} times in the same scope ({where})")
    if not direct:
        return None
    f, s = direct[0]
    return Location(Path(f), s["line"], tuple(s["args"]))


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


def tokenize(text: str) -> list[Token]:
    """Significant tokens with offsets and 1-based lines; raises on text nginx would reject."""
    tokens: list[Token] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ConfigEditError(f"cannot tokenize near line {line}: {text[pos:pos + 20]!r}")
        kind = m.lastgroup or ""
        if kind in ("quoted", "punct", "word"):
            tokens.append(Token(kind, m.group(), m.start(), m.end(), line))
        line += m.group().count("\n")
        pos = m.end()
    return tokens


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


def _replace_args(text: str, directive: str, line: int, occurrence: int, value: str | Sequence[str]) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    tokens = tokenize(text)
    starts = [i for i in _statement_starts(tokens) if tokens[i].line == line and tokens[i].text == directive]
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
    old_args = tuple(t.text for t in arg_tokens)
    if isinstance(value, str):
        # One value: replace the first argument only (keepalive_timeout's optional second
        # argument, the Keep-Alive header timeout, is the administrator's choice).
        new_first = _validate_args([value])
        new_args = new_first + old_args[1:]
        start, end = arg_tokens[0].start, arg_tokens[0].end
        replacement = new_first[0]
    else:
        new_args = _validate_args(value)
        start, end = arg_tokens[0].start, arg_tokens[-1].end
        replacement = " ".join(new_args)
    return text[:start] + replacement + text[end:], old_args, new_args


def _insert_line(text: str, block_line: int, directive: str, args: tuple[str, ...]) -> tuple[str, int]:
    """Insert ``directive args;`` as a new line right after the block's opening brace line.

    Returns the new text and the 1-based line that now holds the statement.
    """
    tokens = tokenize(text)
    brace = next((t for t in tokens if t.line >= block_line and t.text == "{"), None)
    if brace is None:
        raise ConfigEditError(f"no '{{' found for the block at line {block_line}")
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


def _verify(old_path: Path, new_path: Path, directive: str, old_args: tuple[str, ...] | None, new_args: tuple[str, ...]) -> None:
    """Parse the new file alone; it must be the old statement list with only our change."""
    old = _flat(_parse(old_path, single=True)[0]["parsed"])
    new = _flat(_parse(new_path, single=True)[0]["parsed"])
    if old_args is not None:
        diffs = [(a, b) for a, b in zip(old, new, strict=False) if a != b] if len(old) == len(new) else []
        ok = len(diffs) == 1 and diffs[0][0][1:] == (directive, old_args) and diffs[0][1][1:] == (directive, new_args)
    else:
        ok = len(new) == len(old) + 1 and any(
            new[k][1:] == (directive, new_args) and new[:k] + new[k + 1 :] == old for k in range(len(new))
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
    atomic_write(dest, read_text(file), like=file)
    return dest


def restore_backup(file: Path, backup_dir: Path) -> None:
    """Put the backed-up content of ``file`` back, atomically, keeping the live file's mode/owner."""
    src = backup_path(file, backup_dir)
    if not src.exists():
        raise ConfigEditError(f"no backup of {file} in {backup_dir}")
    atomic_write(file, read_text(src))


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
) -> EditResult:
    """Set ``directive`` in the ``http`` block (or the ``server`` named ``server_name``).

    ``value``: a string or int replaces the first argument only (other arguments kept); a
    sequence replaces all arguments. The one file holding the directive (possibly an included
    one) is rewritten with exactly one line changed, or one line inserted after the scope's
    ``{`` when the directive is absent. Raises :class:`ConfigEditError` and writes nothing
    when that cannot be done safely.
    """
    conf = Path(conf_path)
    bdir = Path(backup_dir) if backup_dir is not None else conf.parent / DEFAULT_BACKUP_DIRNAME
    if isinstance(value, int):
        value = str(value)
    configs, (scope_file, scope), direct, nested = _locate(conf, directive, server_name)
    shadowed = tuple(Location(Path(f), s["line"], tuple(s["args"])) for f, s in nested)
    scope_name = f"server {server_name}" if server_name else "http"
    if len(direct) > 1:
        where = ", ".join(f"{f}:{s['line']}" for f, s in direct)
        raise ConfigEditError(f"{directive} is set {len(direct)} times in {scope_name} ({where}); refusing to guess")

    if direct:
        file_s, stmt = direct[0]
        file = Path(file_s)
        parsed = next(c["parsed"] for c in configs if c["file"] == file_s)
        text = read_text(file)
        new_text, old_args, new_args = _replace_args(text, directive, stmt["line"], _occurrence_index(parsed, stmt), value)
        line, inserted = stmt["line"], False
        if new_args == old_args:
            msg = f"{directive} already {' '.join(new_args)} in {file}:{line}"
            return EditResult(file, line, directive, old_args, new_args, False, False, None, shadowed, msg)
        msg = f"{directive} {' '.join(old_args)} -> {' '.join(new_args)} in {file}:{line}"
    else:
        file = Path(scope_file)
        new_args = _validate_args([value] if isinstance(value, str) else value)
        text = read_text(file)
        new_text, line = _insert_line(text, scope["line"], directive, new_args)
        old_args, inserted = None, True
        msg = f"{directive} was absent from {scope_name}; inserted '{directive} {' '.join(new_args)};' at {file}:{line}"
    if shadowed:
        msg += "; note: redefined in nested blocks at " + ", ".join(f"{loc.file}:{loc.line}" for loc in shadowed)

    # Verify on a private copy, then back up and swap in atomically.
    fd, probe = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".verify")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(new_text)
        _verify(file, Path(probe), directive, old_args, new_args)
    finally:
        os.unlink(probe)
    backup = save_backup(file, bdir)
    atomic_write(file, new_text)
    return EditResult(file, line, directive, old_args, new_args, inserted, True, backup, shadowed, msg)
