"""Check generated dashboards against Grafana's own types, without a Grafana server.

Grafana publishes the types its frontend reads a dashboard with as the npm package
``@grafana/schema``; the version pinned in ``package.json`` here is the Grafana the dashboards
target (10.1: the Foundation SDK's ``10.1.0`` writes schemaVersion 36, and compose runs
``grafana/grafana:10.1.5``). ``types.ts`` names the dashboard and each panel type we use in
those types; ``regenerate.py`` converts them once into ``grafana-dashboard.schema.json``
(committed, with its provenance) and type-checks every dashboard with ``tsc`` against the same
types. :func:`validate` checks a dashboard against that JSON schema with ``jsonschema``.

Why a committed JSON schema rather than running ``tsc`` in every test: ``make test`` then needs
neither Node.js nor the npm registry (a fresh Debian machine has neither), and it runs in
milliseconds. The price is the conversion: a converter can get a TypeScript type wrong
(ts-json-schema-generator 2.x turns ``string | false`` into ``false``; 1.5.1 is pinned for that
reason), so ``regenerate.py`` runs ``tsc`` on the same dashboards and fails when the two disagree,
and the tests prove the schema rejects broken dashboards. Strictness: unknown keys are errors
(``additionalProperties: false``), as an object literal typed ``Dashboard`` would be for ``tsc``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs in the lock yet: types-jsonschema

SCHEMA_DIR = Path(__file__).resolve().parent
SCHEMA_FILE = SCHEMA_DIR / "grafana-dashboard.schema.json"


@cache
def schemas() -> Mapping[str, Any]:
    """The committed schema file: ``dashboard``, ``panels`` by panel type, ``source`` (provenance)."""
    data: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    return data


def _errors(schema: Mapping[str, Any], instance: Any, where: str) -> Iterator[str]:
    validator = jsonschema.Draft7Validator(schema)
    for error in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
        # An anyOf names every branch it tried; the most relevant one says what is wrong.
        best = jsonschema.exceptions.best_match([error, *error.context]) if error.context else error
        path = "/".join(str(p) for p in best.absolute_path) or "(top)"
        yield f"{where}: {path}: {best.message}"


def _panels(panels: Any) -> Iterator[Mapping[str, Any]]:
    for panel in panels if isinstance(panels, list) else []:
        if isinstance(panel, Mapping):
            yield panel
            yield from _panels(panel.get("panels"))


def validate(board: Mapping[str, Any], name: str = "dashboard") -> list[str]:
    """Every way ``board`` (a parsed dashboard JSON) departs from Grafana's types; empty when valid.

    The dashboard is checked without its panels, then each panel (rows' nested ones too) against
    the schema of its ``type``; a panel type without a schema is an error.
    """
    found = list(_errors(schemas()["dashboard"], board, name))
    by_type = schemas()["panels"]
    for panel in _panels(board.get("panels")):
        where = f"{name}: panel {panel.get('title')!r} ({panel.get('type')})"
        schema = by_type.get(panel.get("type"))
        if schema is None:
            found.append(f"{where}: no Grafana type for panel type {panel.get('type')!r} "
                         f"(known: {', '.join(sorted(by_type))}; add it to dashboards/schema/types.ts)")
            continue
        found.extend(_errors(schema, panel, where))
    return found
