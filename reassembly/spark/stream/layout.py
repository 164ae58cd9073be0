"""What the streaming job's Spark state holds: its variables, their schemas and encodings, and the
layout number that names them.

This is the checkpoint's contract: the processor (:mod:`.processor`) reads and writes state this
way, and :func:`~reassembly.spark.stream.functions.bind_checkpoint` records :data:`LAYOUT` and
:data:`STATE` in a checkpoint at its first start and refuses one recorded otherwise. Changing a
name, a schema or an encoding here is a new layout (raise :data:`LAYOUT`). No pyspark here: the
command checks a checkpoint before it starts Spark.
"""

from __future__ import annotations

from binascii import a2b_base64, b2a_base64

from reassembly.spark.stream.core import Footprint

# A held row: a whole segment (at = IN_STATE), or a spooled one's header (see spool.py), as base64 text.
# Text, not binary: the state server hands every value read back to Python pickled by Pyrolite, which
# writes a ``byte[]`` as ``bytearray(str, "latin-1")``, one char at a time, then UTF-8 encodes that
# string: JFR put 43% of the JVM's samples in a 128 MiB run there with binary held rows. An ASCII string
# crosses both ways as a plain copy; base64 costs 4/3 the bytes in RocksDB and a C-speed encode/decode here.
HELD = "raw string, at long"
# With input columns kept (lineage: ``ReassemblyOptions.keep_columns``, which the checkpoint's manifest
# records among its options, so a checkpoint is never read with other ones), a held row has one more
# field, ``src``: the struct of its landing row's kept columns. Without, the held row is as above.
# Everything else about a key, in one value, so that one get() answers "new, open or decided?": open
# (``state`` null): its first and last event times, its expiry deadline (its timer), the state bytes of its
# held segments and ``blob`` = core.Summary.dump(); decided: how it ended (``state``), ``blob`` = the
# tombstone (the assembler snapshot), ``deadline_ms`` = when the tombstone goes. One value, not one per
# field: each state variable read is a round trip to the JVM.
KEY = "first_ms long, deadline_ms long, held_bytes long, last_ms long, blob binary, state string"
STATE = {"held": HELD, "key": KEY}  # the state variables by name, as the manifest records them

# LAYOUT changes whenever the state variables or what they hold change meaning (the Summary blob's fields,
# what ``at`` says, how a held row is encoded). Layout 1 kept three value states (``info``, ``summary``,
# ``tomb``) beside ``held``; layout 2 kept these two variables with held rows as ``raw binary``; layout 3
# is the above.
LAYOUT = 3

# ``kind = "state"`` rows: one per key and call that changed what state holds, the change of its
# :class:`~reassembly.spark.stream.core.Footprint` in these numeric columns of the output (the sink
# sums them: the status line's exact state).
KIND_STATE = "state"
FOOTPRINT_COLUMNS = dict(
    zip(
        Footprint._fields,
        ("reason", "segments_used", "stored_length", "original_length", "rejected", "offset"),
        strict=True,
    )
)
# A ``state`` row also names its key (``group_id``) and, in the call that opened the key (``groups`` +1),
# the key's first event time in epoch milliseconds in this column: the sink keeps the set of open keys
# from them, for the status line's age of the oldest held segment.
OPENED_COLUMN = "message_checksum"


def held_text(head: bytes) -> str:
    """A held row's bytes as the state stores them (see :data:`HELD`).

    ``head``: the held row's bytes (a segment, or a spooled segment's header).
    """
    return b2a_base64(head, newline=False).decode("ascii")


def held_bytes(text: str) -> bytes:
    """A held row's bytes from what the state stores (see :data:`HELD`).

    ``text``: the text the state stores.
    """
    return a2b_base64(text)


__all__ = [
    "FOOTPRINT_COLUMNS",
    "HELD",
    "KEY",
    "KIND_STATE",
    "LAYOUT",
    "OPENED_COLUMN",
    "STATE",
    "held_bytes",
    "held_text",
]
