"""IBM MQ reference messages (MQRMH), chunked object transfer, a crash-safe receiver, claim check.

See docs/how-to/refmsg.md for the byte layouts, the integrity block, the journal and
the receiver's guarantees, docs/how-to/claim-check.md for object stores and encryption.
"""

from .chunker import DEFAULT_MAX_LENGTH, Chunker, chunk, new_instance_id
from .claimcheck import (
    CLAIM_CHECK_TYPE,
    DEFAULT_THRESHOLD,
    Claim,
    Message,
    MissingPayload,
    MissingPolicy,
    Stores,
    claim_check_message,
    is_claim_check,
    offload,
    read_claim,
    release,
    resolve,
    resolve_into,
)
from .core import ChunkRow, ObjectState, RangeSet, assemble_chunks
from .envelope import EncryptedStore, EncryptionKeys
from .errors import JournalError, PathError, RmhError, StoreError, StoreFault
from .header import (
    ENCODING_BIG_ENDIAN,
    ENCODING_NATIVE,
    FORMAT_REF_MSG_HEADER,
    LENGTH_1,
    RMH,
    DecodedRMH,
    RmhFlags,
    decode_rmh,
)
from .integrity import Integrity
from .message import DecodedMessage, ReferenceMessage, decode_message
from .receiver import DirectorySource, IncompleteObject, Outcome, RangeSource, Receipt, Receiver
from .stores import DirectoryStore, FsspecStore, ListableStore, ObjectInfo, ObjectStore, StoredObject, open_store

__all__ = [
    "CLAIM_CHECK_TYPE",
    "DEFAULT_MAX_LENGTH",
    "DEFAULT_THRESHOLD",
    "ENCODING_BIG_ENDIAN",
    "ENCODING_NATIVE",
    "FORMAT_REF_MSG_HEADER",
    "LENGTH_1",
    "RMH",
    "ChunkRow",
    "Claim",
    "Chunker",
    "DecodedMessage",
    "DecodedRMH",
    "DirectorySource",
    "DirectoryStore",
    "EncryptedStore",
    "EncryptionKeys",
    "FsspecStore",
    "IncompleteObject",
    "Integrity",
    "JournalError",
    "ListableStore",
    "Message",
    "MissingPayload",
    "MissingPolicy",
    "ObjectInfo",
    "ObjectState",
    "ObjectStore",
    "Outcome",
    "PathError",
    "RangeSet",
    "RangeSource",
    "Receipt",
    "Receiver",
    "ReferenceMessage",
    "RmhError",
    "RmhFlags",
    "StoreError",
    "StoreFault",
    "Stores",
    "StoredObject",
    "assemble_chunks",
    "chunk",
    "claim_check_message",
    "decode_message",
    "decode_rmh",
    "is_claim_check",
    "new_instance_id",
    "offload",
    "open_store",
    "read_claim",
    "release",
    "resolve",
    "resolve_into",
]
