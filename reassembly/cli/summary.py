"""``--summary-json FILE``: the run's summary for an orchestrator, as one JSON document.

:data:`SCHEMA` is the document's JSON Schema (draft 2020-12 keywords, the subset :func:`problems`
checks), defined once here and listed in docs/reference/command-line.md. :class:`Record` collects what a run
learns as it goes (phases and their durations, counts, paths, versions); ``main`` writes it
(:meth:`Record.write`, atomically: a temporary beside FILE renamed over it) once the exit code is
known, whatever the outcome, so FILE never describes an earlier run: a failed or interrupted run's
document has its ``outcome``, ``exit_code`` and ``error``, and ``null`` where nothing was counted. A
usage error (exit code 2) writes nothing, FILE included: it is refused before anything is touched.
"""

from __future__ import annotations

import os
import platform
import shlex
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reassembly._files import write_json

SUMMARY_VERSION = 1
"""The version of the document's layout: raised when a field changes meaning or disappears
(fields may be added without it)."""

_COUNT = {"type": "integer", "minimum": 0}
_COUNT_OR_NULL = {"type": ["integer", "null"], "minimum": 0}
_SECONDS = {"type": ["number", "null"], "minimum": 0}
_PATH_OR_NULL = {"type": ["string", "null"]}
_CONDITIONS = ["incomplete", "corrupt", "quarantine", "skipped"]
IDENTITY = "rows_in = used + quarantined + duplicates"
"""The accounting identity of a batch run: every landing row read is used, quarantined or a duplicate."""
IDENTITY_CARRIED = "rows_in = used + quarantined + duplicates + carried_out"
"""An incremental run's: ``rows_in`` counts the rows carried in, and what is still incomplete is carried out."""
IDENTITY_STREAM = "rows_in + held_before = used + quarantined + duplicates + dropped_by_watermark + held_after"
"""A stream's, per batch and over an invocation's batches: segments held in state before the first
batch and after the last (``held_before``, ``held_after``) belong to no batch's messages yet, and
rows older than the watermark (``dropped_by_watermark``) to none."""
_STREAM_TERMS = ("held_before", "dropped_by_watermark", "held_after")
_TERMS = ("rows_in", "used", "quarantined", "duplicates", *_STREAM_TERMS)


def _object(properties: dict[str, Any], *, nullable: bool = False, optional: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "type": ["object", "null"] if nullable else "object",
        "properties": properties,
        "required": [k for k in properties if k not in optional],
        "additionalProperties": False,
    }


_SKIPPED = _object({"path": {"type": "string"}, "rows_expected": _COUNT_OR_NULL, "rows_read": _COUNT})
"""An input file Spark listed but did not read whole (``spark.sql.files.ignoreCorruptFiles`` or
``ignoreMissingFiles``): its rows by its footer (null: no readable footer) and the rows read."""

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "reassemble --summary-json",
    **_object(
        {
            "summary_version": {"const": SUMMARY_VERSION},
            "command": {"enum": ["run", "demo", "stream", "consume"]},
            "argv": {"type": "array", "items": {"type": "string"}},
            "command_line": {"type": "string"},
            "started_at": {"type": "string", "format": "date-time"},
            "ended_at": {"type": "string", "format": "date-time"},
            "outcome": {"enum": ["completed", "failed", "interrupted"]},
            "exit_code": {"type": "integer"},
            "error": {"type": ["string", "null"]},
            "versions": _object(
                {
                    "reassembly": {"type": "string"},
                    "pyspark": {"type": "string"},
                    "spark": {"type": ["string", "null"]},
                    "python": {"type": "string"},
                }
            ),
            "schema_version": {"type": ["integer", "string", "null"]},
            "input": _object(
                {
                    "pattern": {"type": "string"},
                    "paths": _COUNT_OR_NULL,
                    "bytes": _COUNT_OR_NULL,
                    "skipped_files": {"type": "array", "items": _SKIPPED},
                },
                nullable=True,
                optional=["skipped_files"],
            ),
            "output": _object(
                {
                    "directory": {"type": "string"},
                    "messages": {"type": "string"},
                    "quarantine": {"type": "string"},
                    "payloads": _PATH_OR_NULL,
                },
                nullable=True,
            ),
            "counts": _object(
                {
                    "rows_in": _COUNT,
                    "messages": {"type": "object", "additionalProperties": _COUNT},
                    "message_bytes": {"type": "object", "additionalProperties": _COUNT},
                    "quarantined": _COUNT,
                    "quarantined_by_reason": {
                        "type": "array",
                        "items": _object(
                            {"reason": {"type": "integer"}, "reason_name": {"type": "string"}, "segments": _COUNT}
                        ),
                    },
                    "duplicates": _COUNT,
                    "used": _COUNT,
                },
                nullable=True,
                optional=["message_bytes", "quarantined_by_reason", "used"],
            ),
            "accounting": _object(
                {
                    "identity": {"enum": [IDENTITY, IDENTITY_CARRIED, IDENTITY_STREAM]},
                    "rows_in": _COUNT,
                    "used": _COUNT,
                    "quarantined": _COUNT,
                    "duplicates": _COUNT,
                    "carried_in": _COUNT,
                    "carried_out": _COUNT,
                    **dict.fromkeys(_STREAM_TERMS, _COUNT),
                    "holds": {"type": "boolean"},
                },
                nullable=True,
                optional=["carried_in", "carried_out", *_STREAM_TERMS],
            ),
            "durations_seconds": {
                "type": "object",
                "properties": {"total": {"type": "number", "minimum": 0}},
                "required": ["total"],
                "additionalProperties": _SECONDS,
            },
            "throughput_mib_per_second": {"type": ["number", "null"], "minimum": 0},
            "conditions": _object({name: {"type": "boolean"} for name in _CONDITIONS}, nullable=True),
            "fail_on": _object(
                {
                    "requested": {"type": "array", "items": {"enum": _CONDITIONS}},
                    "held": {"type": "array", "items": {"enum": _CONDITIONS}},
                }
            ),
            "demo": _object(
                {
                    "messages_expected": _COUNT,
                    "messages_as_expected": _COUNT,
                    "segments_generated": _COUNT,
                    "check_passed": {"type": "boolean"},
                    "kept": {"type": "boolean"},
                },
                nullable=True,
            ),
            "incremental": _object(
                {
                    "run": {"type": ["integer", "null"], "minimum": 1},
                    "checkpoint": {"type": "string"},
                    "new_files": _COUNT,
                    "carried_in": _COUNT,
                    "carried_out": _object(
                        {
                            "rows": _COUNT,
                            "groups": _COUNT,
                            "bytes": _COUNT,
                            "oldest_first_read_ms": _COUNT_OR_NULL,
                        }
                    ),
                    "expired_groups": _object({"age": _COUNT, "size": _COUNT}),
                }
            ),
            "stream": _object(
                {
                    "checkpoint": {"type": "string"},
                    "trigger": {"type": "string"},
                    "batches": {"type": "array", "items": _COUNT},
                    "late": _COUNT,
                    "late_duplicates": _COUNT,
                    "dropped_by_watermark": _COUNT,
                    "accounting_by_batch": {
                        "type": "array",
                        "items": _object(
                            {
                                "batch": _COUNT,
                                **dict.fromkeys(_TERMS, _COUNT),
                                "holds": {"type": "boolean"},
                            }
                        ),
                    },
                    "held": _object(
                        {"groups": _COUNT, "segments": _COUNT, "held_bytes": _COUNT, "spooled_bytes": _COUNT},
                        nullable=True,
                    ),
                    "tombstones": _COUNT_OR_NULL,
                    "stopped": {"enum": ["end of input", "no input", "ctrl-c"]},
                }
            ),
            "consume": {"type": "object"},
            "scan_tasks": _object({"staged": _COUNT, "passed_through": _COUNT}, nullable=True),
        },
        optional=["demo", "incremental", "stream", "consume", "scan_tasks"],
    ),
}
"""The JSON Schema of the ``--summary-json`` document (docs/reference/command-line.md explains each field)."""

_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def problems(doc: Any, schema: dict[str, Any] = SCHEMA, at: str = "$") -> list[str]:
    """Where ``doc`` breaks ``schema``: one line per problem, empty when it conforms.

    Checks the keywords :data:`SCHEMA` uses (type, const, enum, minimum, properties, required,
    additionalProperties, items); enough to check a document without a JSON Schema library.

    ``doc``: the document checked. ``schema``: the JSON Schema it is checked against. ``at``: the JSON path of ``doc``
    in the whole document, which the lines name.
    """
    found: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        # bool is an int in Python, not in JSON
        ok = any(
            isinstance(doc, _TYPES[n]) and not (isinstance(doc, bool) and n in ("integer", "number")) for n in names
        )
        if not ok:
            return [f"{at}: {type(doc).__name__} {doc!r:.60} is not {' or '.join(names)}"]
    if "const" in schema and doc != schema["const"]:
        found.append(f"{at}: {doc!r} is not {schema['const']!r}")
    if "enum" in schema and doc not in schema["enum"]:
        found.append(f"{at}: {doc!r} is not one of {schema['enum']}")
    if "minimum" in schema and isinstance(doc, (int, float)) and doc < schema["minimum"]:
        found.append(f"{at}: {doc} is below {schema['minimum']}")
    if isinstance(doc, dict):
        properties = schema.get("properties", {})
        found += [f"{at}: {key!r} is missing" for key in schema.get("required", ()) if key not in doc]
        extra = schema.get("additionalProperties", True)
        for key, value in doc.items():
            if key in properties:
                found += problems(value, properties[key], f"{at}.{key}")
            elif extra is False:
                found.append(f"{at}: {key!r} is not expected")
            elif isinstance(extra, dict):
                found += problems(value, extra, f"{at}.{key}")
    if isinstance(doc, list) and "items" in schema:
        for i, item in enumerate(doc):
            found += problems(item, schema["items"], f"{at}[{i}]")
    return found


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def library_version() -> str:
    """The installed distribution's version (``segment-reassembly``), or ``unknown`` when run from a source tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("segment-reassembly")
    except PackageNotFoundError:
        return "unknown"


def pyspark_version() -> str:
    """The pyspark package's version: the Spark the command starts locally (a cluster may run another)."""
    try:
        from pyspark.version import __version__

        return str(__version__)
    except ImportError:
        return "not installed"


def process_age() -> float | None:
    """Seconds since this process started (the interpreter's start and every import up to the call),
    from ``/proc/self/stat`` (Linux; None elsewhere), to 10 ms."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime: clock ticks after boot
        return round(max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started), 3)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Record:
    """What a run learns as it goes, for ``--summary-json``: the subcommand sets fields, ``main`` writes it.

    ``command``: the subcommand's name. ``argv``: the command line as given, recorded in the document.
    """

    def __init__(self, command: str, argv: Sequence[str]) -> None:
        self.command = command
        self.argv = list(argv)
        self.started_at = _now()
        self._start = time.monotonic()
        self.durations: dict[str, float] = {}
        self.fields: dict[str, Any] = {
            "spark": None,
            "schema_version": None,
            "input": None,
            "output": None,
            "counts": None,
            "accounting": None,
            "throughput_mib_per_second": None,
            "conditions": None,
            "fail_on": {"requested": [], "held": []},
        }

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``durations_seconds[name]`` (recorded also when it fails); ``name``: the
        phase's key there (``spark_start``, ``read``, ...)."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.durations[name] = round(time.monotonic() - start, 3)

    def document(self, exit_code: int, outcome: str, error: str | None) -> dict[str, Any]:
        """The JSON document (see :data:`SCHEMA`).

        ``exit_code``: the command's exit code. ``outcome``: ``completed``, ``failed`` or ``interrupted``. ``error``:
        the error line of a failed run (None: none).
        """
        f = self.fields
        doc: dict[str, Any] = {
            "summary_version": SUMMARY_VERSION,
            "command": self.command,
            "argv": self.argv,
            "command_line": shlex.join(["reassemble", *self.argv]),
            "started_at": self.started_at,
            "ended_at": _now(),
            "outcome": outcome,
            "exit_code": exit_code,
            "error": error,
            "versions": {
                "reassembly": library_version(),
                "pyspark": pyspark_version(),
                "spark": f["spark"],
                "python": platform.python_version(),
            },
            "durations_seconds": {"total": round(time.monotonic() - self._start, 3), **self.durations},
        }
        doc.update((k, v) for k, v in f.items() if k != "spark")
        return doc

    def write(self, path: str, exit_code: int, outcome: str, error: str | None) -> None:
        """Write the document to ``path`` atomically (a hidden temporary beside it, renamed over it).

        ``path``: the file written. ``exit_code``, ``outcome``, ``error``: as for :meth:`document`.
        """
        write_json(Path(path), self.document(exit_code, outcome, error))


__all__ = [
    "IDENTITY",
    "IDENTITY_CARRIED",
    "IDENTITY_STREAM",
    "SCHEMA",
    "SUMMARY_VERSION",
    "Record",
    "library_version",
    "problems",
    "process_age",
    "pyspark_version",
]
