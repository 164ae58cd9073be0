"""The optional compiled decoder (segmenter/_fastwire.c); segmenter.wire configures and uses it."""

from collections.abc import Callable
from typing import Any

def decode_segment(
    buf: Any, *, max_segment_size: int = ..., max_message_size: int = ..., verify: bool = ...
) -> Any: ...
def configure(
    header_type: type,
    segment_type: type,
    codecs: tuple[Any, ...],
    algorithms: tuple[Any, ...],
    data_crcs: tuple[Callable[..., int] | None, ...],
    python_decode_segment: Callable[..., Any],
    default_max_segment_size: int,
    default_max_message_size: int,
    max_header_length: int,
    /,
) -> None: ...
