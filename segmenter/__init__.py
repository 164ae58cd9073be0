"""Producer-side segmentation: split large payloads into MQ-style segments.

See README.md for examples and docs/concepts/wire-format.md for the byte layout.
"""

from .checksum import DEFAULT_ALGORITHM, ChecksumAlgorithm, checksum, combine
from .errors import (
    ChecksumError,
    ConflictError,
    DecompressionError,
    FlagsError,
    HeaderError,
    IncompleteError,
    LimitError,
    MessageTooBigError,
    OffsetError,
    OriginalLengthError,
    Reason,
    SegmentationError,
    SegmentLengthZeroError,
    SequenceError,
)
from .flags import Codec, MsgFlags
from .producer import (
    DEFAULT_SEGMENT_SIZE,
    GroupWriter,
    MessageWriter,
    Segmenter,
    new_group_id,
    segment,
    segment_group,
    write_segments,
)
from .wire import (
    HEADER_LENGTH,
    UNKNOWN_LENGTH,
    Segment,
    SegmentHeader,
    SegmentStreamDecoder,
    decode_header,
    decode_segment,
)

__all__ = [
    "DEFAULT_ALGORITHM",
    "DEFAULT_SEGMENT_SIZE",
    "HEADER_LENGTH",
    "UNKNOWN_LENGTH",
    "ChecksumAlgorithm",
    "ChecksumError",
    "Codec",
    "ConflictError",
    "DecompressionError",
    "FlagsError",
    "GroupWriter",
    "HeaderError",
    "IncompleteError",
    "LimitError",
    "MessageTooBigError",
    "MessageWriter",
    "MsgFlags",
    "OffsetError",
    "OriginalLengthError",
    "Reason",
    "Segment",
    "SegmentHeader",
    "SegmentLengthZeroError",
    "SegmentStreamDecoder",
    "Segmenter",
    "SegmentationError",
    "SequenceError",
    "checksum",
    "combine",
    "decode_header",
    "decode_segment",
    "new_group_id",
    "segment",
    "segment_group",
    "write_segments",
]
