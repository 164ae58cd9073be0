"""Errors specific to reference messages, all under the library's one hierarchy."""

from __future__ import annotations

from segmenter.errors import Reason, SegmentationError


class RmhError(SegmentationError):
    """An MQRMH is malformed (MQ 2220), or one of its strings is misplaced (2261-2264)."""

    default_reason = Reason.RMH_ERROR


class PathError(SegmentationError):
    """A destination name would escape the receiver's root, or names something unsafe."""

    default_reason = Reason.PATH_ERROR


class StoreError(SegmentationError):
    """A claim-check store cannot find, read or write an object."""

    default_reason = Reason.STORE_ERROR


class JournalError(SegmentationError):
    """A receiver journal is damaged somewhere other than a torn last record."""

    default_reason = Reason.STATE_ERROR
