"""Errors specific to reference messages, all under the library's one hierarchy."""

from __future__ import annotations

from enum import Enum

from segmenter.errors import Reason, SegmentationError


class RmhError(SegmentationError):
    """An MQRMH is malformed (MQ 2220), or one of its strings is misplaced (2261-2264)."""

    default_reason = Reason.RMH_ERROR


class PathError(SegmentationError):
    """A destination name would escape the receiver's root, or names something unsafe."""

    default_reason = Reason.PATH_ERROR


class StoreFault(str, Enum):
    """What went wrong with a store, beyond the :class:`~segmenter.errors.Reason`: ``details["cause"]``.

    Only :attr:`MISSING` is what ``missing="skip"`` skips; every other cause is
    an error whatever the policy.
    """

    MISSING = "missing"  # no object under the key (deleted, never stored, or expired by a lifecycle rule)
    NOT_ALLOWED = "not_allowed"  # the reference names a store outside the receiver's allowlist
    WRONG_STORE = "wrong_store"  # the reference names another store than the one given
    NOT_AN_OBJECT = "not_an_object"  # the key names a symlink (or one is on the way), a directory, FIFO, device
    ENVELOPE = "envelope"  # an encrypted object's envelope is malformed, truncated or extended
    NOT_INSTALLED = "not_installed"  # an optional package (fsspec, s3fs, cryptography) is absent
    CONFIG = "config"  # a store built with arguments that cannot work


class StoreError(SegmentationError):
    """A claim-check store cannot find, read or write an object.

    ``details["cause"]`` is a :class:`StoreFault` where one applies;
    :attr:`missing` is true only when the object does not exist.
    """

    default_reason = Reason.STORE_ERROR

    @property
    def missing(self) -> bool:
        """True when the object is not there (and only then): what ``missing="skip"`` skips."""
        return self.details.get("cause") == StoreFault.MISSING


class JournalError(SegmentationError):
    """A receiver journal is damaged somewhere other than a torn last record."""

    default_reason = Reason.STATE_ERROR
