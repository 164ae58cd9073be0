"""The digest policy read from the command line: a keyring file of HMAC keys, and ``--require-sha256``."""

from __future__ import annotations

import json

from reassembly._errors import UsageError, first_line
from segmenter.digest import DigestPolicy, Keyring
from segmenter.errors import SegmentationError


def load_keyring(path: str) -> Keyring:
    """A keyring file: JSON ``{"current": "<key id>", "keys": {"<key id>": "<hex key>", ...}}``.

    ``current`` (optional) names the signing key; every key in ``keys`` verifies. Errors name
    the file and the key id, never a key. Keep the file readable by the job's user only.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"keyring {path}: {type(exc).__name__}: {first_line(exc)}") from None
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, dict) or not keys or not all(isinstance(v, str) for v in keys.values()):
        raise UsageError(f'keyring {path}: expected {{"current": ID, "keys": {{ID: HEX, ...}}}}')
    raw: dict[str, bytes] = {}
    for key_id, text in keys.items():
        try:
            raw[str(key_id)] = bytes.fromhex(text)
        except ValueError:
            raise UsageError(f"keyring {path}: key {key_id!r} is not hex") from None
    try:
        return Keyring(raw, current=doc.get("current"))
    except SegmentationError as exc:
        raise UsageError(f"keyring {path}: {exc}") from None


def digest_policy(require_sha256: bool, keyring_path: str | None) -> DigestPolicy:
    """The reader's policy from the command line (``--require-sha256``, ``--hmac-keyring FILE``)."""
    return DigestPolicy(sha256=require_sha256, keyring=load_keyring(keyring_path) if keyring_path else None)
