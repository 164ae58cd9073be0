"""Claim check: big payloads go to a store, the message carries a small MQRMH pointing at them.

:func:`offload` stores a payload above ``threshold`` (default 256 KiB, the
threshold the AWS extended clients use by default, from SQS's former limit) and returns a header-only reference
message: ObjectType ``"CLAIMCHK"``, SrcEnv the store's name, SrcName the key,
DataLogicalLength the size, and the integrity block with the object length and
checksum, sealed by the header checksum. Smaller payloads travel inline.

Recognising a reference (docs/how-to/refmsg.md, "Claim check"): a message whose MQMD
Format is ``"MQHREF  "`` is one; any other body is one when
:func:`is_claim_check` says so, i.e. its first four bytes are the MQRMH StrucId
``"RMH "`` or one bit away from it (or a non-empty prefix of it). A reference,
once recognised, must pass every check or :func:`resolve` raises: a damaged
reference is never handed back as if it were the payload. :func:`offload` never
sends such a body inline (it stores it, whatever its size), so every inline
payload it produces comes back unchanged.

Resolving checks the stored object's size, as the store reports it, before
reading a byte, then reads exactly the declared number of bytes in bounded
pieces, updating the checksum as it reads (:func:`resolve_into` streams into a
file in pieces of ``chunk_size``; :func:`resolve` returns the payload).

The receiving side (docs/how-to/claim-check.md): ``store`` is one store, or an
allowlist mapping the store names references may carry to stores, checked
before any store is touched; ``missing="skip"`` turns a missing object into a
:class:`MissingPayload` (never ``b""``); :func:`release` deletes a payload after
the consumer's commit, the safe order (``delete=True`` deletes before it).

Stores (:mod:`refmsg.stores`) implement :class:`~refmsg.stores.ObjectStore`
(put/open/delete by key): a directory, any fsspec file system, and
:class:`~refmsg.envelope.EncryptedStore` over either.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import BinaryIO, Literal, NamedTuple, overload

from segmenter.checksum import DEFAULT_ALGORITHM, ChecksumAlgorithm, checksum, checksum_function
from segmenter.digest import NO_DIGESTS, NO_POLICY, DigestPolicy, Digests
from segmenter.errors import ChecksumError, MessageTooBigError, Reason, SegmentationError
from segmenter.sources import argument_error, byte_view

from .chunker import new_instance_id
from .errors import RmhError, StoreError, StoreFault
from .header import (
    CCSID_UTF8,
    ENCODING_NATIVE,
    FORMAT_NONE,
    FORMAT_REF_MSG_HEADER,
    MAX_MQLONG,
    RMH,
    STRUC_ID,
    RmhFlags,
)
from .integrity import Integrity
from .message import ReferenceMessage, decode_message
from .stores import DirectoryStore as DirectoryStore  # re-exported: refmsg.claimcheck.DirectoryStore
from .stores import ObjectStore, StoredObject

Buffer = bytes | bytearray | memoryview
Stores = ObjectStore | Mapping[str, ObjectStore]  # one store, or an allowlist: the name a reference must carry -> store
MissingPolicy = Literal["raise", "skip"]

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD = 256 * 1024
CLAIM_CHECK_TYPE = "CLAIMCHK"
DEFAULT_CHUNK_SIZE = 1 << 20  # bytes per read when streaming: what resolve_into holds at a time
_STRUC_ID = int.from_bytes(STRUC_ID, "big")


class Message(NamedTuple):
    """A message body and its MQMD Format ("MQHREF  " when it is a claim check)."""

    format: str
    """The message's MQMD Format, 8 characters (``"MQHREF  "`` for a claim check)."""
    body: bytes
    """The message body: a reference message for a claim check, else the payload itself."""

    @property
    def is_reference(self) -> bool:
        return self.format == FORMAT_REF_MSG_HEADER


class Claim(NamedTuple):
    """What a verified claim-check reference says: where the object is, its size and checksum."""

    store: str
    """The store's name, from the header's SrcEnv."""
    key: str
    """The object's key in that store, from the header's SrcName."""
    length: int
    """The object's length in bytes (the header's DataLogicalLength)."""
    algorithm: ChecksumAlgorithm
    """The algorithm of ``checksum``."""
    checksum: int
    """The whole object's checksum, checked when the object is read back."""
    digests: Digests = NO_DIGESTS
    """SHA-256 / HMAC-SHA-256 of the object, when the producer added them."""


def is_claim_check(body: Buffer) -> bool:
    """True when :func:`resolve` takes ``body`` (bare, or under a Format other than "MQHREF  ") as a reference.

    That is when its first four bytes are the StrucId ``"RMH "`` or one bit away
    from it, or the body is a non-empty prefix of ``"RMH "``: a reference with
    a flipped StrucId bit, or truncated, is still recognised (and then refused
    as damaged) instead of passing as a payload. Payloads that match are never
    sent inline by :func:`offload`.
    """
    head = bytes(memoryview(body)[:4])
    if len(head) < 4:
        return len(head) > 0 and STRUC_ID.startswith(head)
    return (int.from_bytes(head, "big") ^ _STRUC_ID).bit_count() <= 1


def claim_check_message(
    store_name: str,
    key: str,
    length: int,
    object_checksum: int,
    *,
    algorithm: ChecksumAlgorithm = DEFAULT_ALGORITHM,
    data_format: str = FORMAT_NONE,
    header_encoding: int = ENCODING_NATIVE,
    ccsid: int = CCSID_UTF8,
    digests: Digests = NO_DIGESTS,
) -> Message:
    """The header-only reference message for an object already in a store (what :func:`offload` sends).

    ``data_format``, ``header_encoding`` and ``ccsid`` describe the payload
    (MQRMH Format, Encoding, CodedCharSetId), for the application that resolves it;
    ``digests`` (of the object) travel in the integrity block.

    ``store_name``: the name of the store that holds the object, which the resolving side looks up. ``key``: the
    object's key in that store. ``length``: the object's size in bytes. ``object_checksum``: its checksum by
    ``algorithm`` (the checksum the reference carries to verify the fetched bytes).
    """
    if not 0 <= length <= MAX_MQLONG:
        raise MessageTooBigError(f"{length} bytes exceed DataLogicalLength's range", length=length, limit=MAX_MQLONG)
    algorithm = ChecksumAlgorithm.parse(algorithm)
    header = RMH(
        flags=RmhFlags.LAST,
        object_type=CLAIM_CHECK_TYPE,
        object_instance_id=new_instance_id(),
        src_env=store_name,
        src_name=key,
        data_logical_length=length,
        format=data_format,
        encoding=header_encoding,
        ccsid=ccsid,
    )
    integrity = Integrity(algorithm, object_checksum, length, object_checksum, digests)
    return Message(FORMAT_REF_MSG_HEADER, ReferenceMessage(header, b"", integrity).encode())


def offload(
    payload: Buffer,
    store: ObjectStore,
    *,
    threshold: int = DEFAULT_THRESHOLD,
    algorithm: ChecksumAlgorithm = DEFAULT_ALGORITHM,
    key: str | None = None,
    inline_format: str = FORMAT_NONE,
    header_encoding: int = ENCODING_NATIVE,
    ccsid: int = CCSID_UTF8,
    digest: DigestPolicy = NO_POLICY,
) -> Message:
    """The payload itself when it is at most ``threshold`` bytes, else a claim-check reference message.

    A reference carries the SHA-256 / HMAC-SHA-256 of the payload that ``digest``
    asks for. A payload that :func:`is_claim_check` would take for a reference is stored
    whatever its size, so that :func:`resolve` gives every offloaded payload back.

    ``payload``: the message's bytes (any bytes-like object, counted in bytes). ``store``: where a payload over the
    threshold is put. ``algorithm``: the checksum of the stored object carried in the reference. ``key``: the object's
    key (None: a random UUID). ``inline_format``: the MQ Format of the payload, kept on an inline message and written as
    the reference's DataFormat. ``header_encoding``, ``ccsid``: the payload's Encoding and CodedCharSetId, carried in
    the reference.
    """
    if inline_format == FORMAT_REF_MSG_HEADER:  # resolve() would take any inline payload for a reference
        raise argument_error(f"inline_format {inline_format!r} is the claim check's own Format")
    payload = byte_view(payload)  # sizes in bytes: an array('Q') view counts 8 per item
    if len(payload) <= threshold and not is_claim_check(payload):
        return Message(inline_format, bytes(payload))
    algorithm = ChecksumAlgorithm.parse(algorithm)
    key = key or uuid.uuid4().hex
    message = claim_check_message(  # first: a payload it refuses (too big, bad key text) is not stored
        store.name,
        key,
        len(payload),
        checksum(algorithm, payload),
        algorithm=algorithm,
        data_format=inline_format,
        header_encoding=header_encoding,
        ccsid=ccsid,
        digests=digest.sign((payload,)),
    )
    store.put(key, payload)
    return message


def read_claim(body: Buffer) -> Claim:
    """Decode and self-check a claim-check reference; raise on anything a damaged or forged one would show.

    Beyond the MQRMH rules and the integrity block (required; its header
    checksum covers every byte): the message ends at StrucLength (nothing
    appended), ObjectType is "CLAIMCHK", LAST is set, the offset is 0, the
    object length and checksum are present and agree with DataLogicalLength
    and the chunk checksum, and the store and key are named.

    ``body``: the message body, the reference's bytes from its first (the StrucId ``"RMH "``).
    """
    decoded = decode_message(body, require_integrity=True)
    ref, struc_length = decoded.message, decoded.layout.struc_length
    rmh, integrity = ref.header, ref.integrity
    assert integrity is not None  # require_integrity
    if len(body) != struc_length:
        raise RmhError(
            f"a claim check is {struc_length} bytes (its StrucLength), this message has {len(body)}",
            struc_length=struc_length,
            length=len(body),
        )
    if rmh.object_type != CLAIM_CHECK_TYPE:
        raise RmhError(f"ObjectType {rmh.object_type!r} is not a claim check", object_type=rmh.object_type)
    if not rmh.is_last or rmh.data_logical_offset != 0:
        raise RmhError(
            "a claim check is one LAST message at offset 0",
            flags=rmh.flags,
            offset=rmh.data_logical_offset,
        )
    if (integrity.object_length, integrity.object_checksum) != (rmh.data_logical_length, integrity.chunk_checksum):
        raise RmhError(
            "object length and checksum absent or disagreeing with DataLogicalLength and the chunk checksum",
            data_logical_length=rmh.data_logical_length,
            object_length=integrity.object_length,
            chunk_checksum=integrity.chunk_checksum,
            object_checksum=integrity.object_checksum,
        )
    if not rmh.src_env or not rmh.src_name:
        raise RmhError("a claim check names its store (SrcEnv) and key (SrcName)", src_env=rmh.src_env)
    return Claim(
        rmh.src_env,
        rmh.src_name,
        rmh.data_logical_length,
        integrity.algorithm,
        integrity.chunk_checksum,
        integrity.digests,
    )


def _claim_of(message: Message | Buffer) -> Claim | None:
    """The verified claim a message carries, or None when its body is the payload itself."""
    if isinstance(message, Message):
        if message.is_reference:
            return read_claim(message.body)
        message = message.body
    return read_claim(message) if is_claim_check(message) else None


class MissingPayload(NamedTuple):
    """What :func:`resolve` and :func:`resolve_into` return with ``missing="skip"`` when the object is gone.

    Never an empty payload: a distinct type, so a caller cannot mistake it for
    ``b""``. ``claim`` names the store, key, length and checksum the reference declared.
    """

    claim: Claim

    @property
    def key(self) -> str:
        return self.claim.key

    @property
    def store(self) -> str:
        return self.claim.store


def _store_for(claim: Claim, store: Stores) -> ObjectStore:
    """The store a verified claim may be read from: refused before any store is touched otherwise.

    With a mapping (an allowlist) the reference's store name must be one of its
    keys; with one store it must be that store's ``name``.
    """
    if isinstance(store, Mapping):
        chosen = store.get(claim.store)
        if chosen is None:
            raise StoreError(
                f"message points at store {claim.store!r}, which is not in the allowlist {sorted(store)!r}",
                cause=StoreFault.NOT_ALLOWED,
                env=claim.store,
                allowed=sorted(store),
            )
        return chosen
    if claim.store != store.name:
        raise StoreError(
            f"message points at store {claim.store!r}, resolving with {store.name!r}",
            cause=StoreFault.WRONG_STORE,
            env=claim.store,
        )
    return store


def _check_missing_policy(missing: str) -> None:
    if missing not in ("raise", "skip"):
        raise argument_error(f"missing={missing!r}: 'raise' or 'skip'")


def _open_checked(claim: Claim, store: Stores, max_size: int, missing: MissingPolicy) -> StoredObject | None:
    """The stored object, opened only after the store name and sizes are known to be right.

    None when the object is missing and ``missing`` is ``"skip"``.
    """
    chosen = _store_for(claim, store)
    if claim.length > max_size:
        raise MessageTooBigError(
            f"claim check for {claim.length} bytes, limit {max_size}", length=claim.length, limit=max_size
        )
    try:
        obj = chosen.open(claim.key)
    except StoreError as exc:
        if missing == "skip" and exc.missing:
            log.info("claim check %s/%s: object missing, skipped", claim.store, claim.key)
            return None
        raise
    if obj.size != claim.length:
        obj.stream.close()
        raise StoreError(
            f"stored object {claim.key!r} holds {obj.size} bytes, {claim.length} expected",
            reason=Reason.OBJECT_SIZE_ERROR,
            key=claim.key,
            length=obj.size,
            expected=claim.length,
        )
    return obj


def _read(stream: BinaryIO, want: int, claim: Claim, done: int) -> bytes:
    """One bounded read; a back end's own I/O error (fsspec, botocore) becomes a StoreError."""
    try:
        return stream.read(want)
    except SegmentationError:
        raise
    except (OSError, ValueError) as exc:
        raise StoreError(
            f"stored object {claim.key!r}: read failed at {done} of {claim.length}: {exc}",
            key=claim.key,
            offset=done,
        ) from None


def _verified_pieces(claim: Claim, stream: BinaryIO, chunk_size: int, digest: DigestPolicy) -> Iterator[bytes]:
    """The object in pieces of at most ``chunk_size``, never reading past ``claim.length``.

    The checksum (and the digests ``digest`` checks) is
    updated as each piece is read; the last piece is yielded only once the
    whole object matched, so no consumer ever holds all of a wrong object.
    Growth after the size check is harmless (not read); a stream that ends
    early is an OBJECT_SIZE_ERROR. A digest ``digest`` demands and the claim
    lacks is refused before anything is read.
    """
    hasher = digest.verifier(claim.digests)  # refuses a demanded digest the claim lacks
    crc: Callable[[bytes, int], int] = checksum_function(claim.algorithm)
    value, done = 0, 0
    held = b""
    while done < claim.length:
        want = min(chunk_size, claim.length - done)
        piece = _read(stream, want, claim, done)
        if not piece or len(piece) > want:
            raise StoreError(
                f"stored object {claim.key!r} changed while read: {len(piece)} bytes for a read of {want} "
                f"at {done} of {claim.length}",
                reason=Reason.OBJECT_SIZE_ERROR,
                key=claim.key,
                offset=done,
                read=len(piece),
                expected=claim.length,
            )
        value = crc(piece, value)
        hasher.update(piece)
        done += len(piece)
        if held:
            yield held
        held = piece
    if value != claim.checksum:
        raise ChecksumError(
            f"stored object {claim.key!r}: checksum 0x{value:08x}, expected 0x{claim.checksum:08x}",
            reason=Reason.MESSAGE_CHECKSUM_ERROR,
            key=claim.key,
            computed=value,
            expected=claim.checksum,
            length=claim.length,
        )
    digest.check(claim.digests, hasher.digests())
    if held:
        yield held


@overload
def resolve(
    message: Message | Buffer,
    store: Stores,
    *,
    delete: bool = ...,
    max_size: int = ...,
    digest: DigestPolicy = ...,
    missing: Literal["raise"] = ...,
) -> bytes: ...


@overload
def resolve(
    message: Message | Buffer,
    store: Stores,
    *,
    delete: bool = ...,
    max_size: int = ...,
    digest: DigestPolicy = ...,
    missing: MissingPolicy,
) -> bytes | MissingPayload: ...


def resolve(
    message: Message | Buffer,
    store: Stores,
    *,
    delete: bool = False,
    max_size: int = MAX_MQLONG,
    digest: DigestPolicy = NO_POLICY,
    missing: MissingPolicy = "raise",
) -> bytes | MissingPayload:
    """The payload: inline as is, or fetched from ``store`` and verified (size first, then checksum).

    ``store`` is one store (the reference must name it) or an allowlist, a
    mapping from the store names references may carry to stores: a reference
    naming any other store is refused before any store is touched
    (StoreError, ``details["cause"]`` ``"not_allowed"``). A reference (see
    :func:`is_claim_check`) that fails any check raises a
    :class:`~segmenter.errors.SegmentationError` with its reason; it is never
    returned as a payload. A reference for more than ``max_size`` bytes is
    refused before the store is asked (2030). The object is read once, exactly
    its declared size. ``digest`` says which SHA-256 / HMAC-SHA-256 a reference
    must carry and holds the keys to check them.

    ``missing="skip"`` returns a :class:`MissingPayload` instead of raising when
    the object does not exist (the SQS extended client's ``ignorePayloadNotFound``);
    any other failure still raises. ``delete=True`` removes the object as soon as
    it is verified, *before* the caller has committed its work: a crash then
    loses the payload while the message is redelivered. Prefer :func:`release`
    after the commit.

    ``message``: the :class:`Message` received, or its body bytes (a reference is recognised by :func:`is_claim_check`).
    """
    _check_missing_policy(missing)
    claim = _claim_of(message)
    if claim is None:
        return bytes(message.body if isinstance(message, Message) else message)
    obj = _open_checked(claim, store, max_size, missing)
    if obj is None:
        return MissingPayload(claim)
    with obj.stream:
        # One piece when the stream delivers it (one buffer, no join copy); more only if it reads short.
        data = b"".join(_verified_pieces(claim, obj.stream, max(claim.length, 1), digest))
    if delete:
        _store_for(claim, store).delete(claim.key)
    return data


@overload
def resolve_into(
    message: Message | Buffer,
    store: Stores,
    sink: BinaryIO,
    *,
    delete: bool = ...,
    max_size: int = ...,
    chunk_size: int = ...,
    digest: DigestPolicy = ...,
    missing: Literal["raise"] = ...,
) -> int: ...


@overload
def resolve_into(
    message: Message | Buffer,
    store: Stores,
    sink: BinaryIO,
    *,
    delete: bool = ...,
    max_size: int = ...,
    chunk_size: int = ...,
    digest: DigestPolicy = ...,
    missing: MissingPolicy,
) -> int | MissingPayload: ...


def resolve_into(
    message: Message | Buffer,
    store: Stores,
    sink: BinaryIO,
    *,
    delete: bool = False,
    max_size: int = MAX_MQLONG,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    digest: DigestPolicy = NO_POLICY,
    missing: MissingPolicy = "raise",
) -> int | MissingPayload:
    """Write the payload into ``sink`` with memory bounded by ``chunk_size``; return the bytes written.

    Checks as :func:`resolve` does (allowlist, ``missing``, ``delete`` alike),
    the checksum updated piece by piece. When it raises, ``sink`` may hold part
    of the object, never all of it: write to a temporary file and rename it
    only after this returns. With ``missing="skip"`` and no object, nothing is
    written and a :class:`MissingPayload` is returned.

    ``message``: the :class:`Message` received, or its body bytes. ``store``: one store or an allowlist, as for
    :func:`resolve`. ``max_size``: the largest object accepted, in bytes. ``digest``: the digests a reference must carry
    and the keys to check them.
    """
    if chunk_size < 1:
        raise SegmentationError(f"chunk_size {chunk_size} must be positive", chunk_size=chunk_size)
    _check_missing_policy(missing)
    claim = _claim_of(message)
    if claim is None:
        return sink.write(message.body if isinstance(message, Message) else message)
    obj = _open_checked(claim, store, max_size, missing)
    if obj is None:
        return MissingPayload(claim)
    written = 0
    with obj.stream:
        for piece in _verified_pieces(claim, obj.stream, chunk_size, digest):
            written += sink.write(piece)
    if delete:
        _store_for(claim, store).delete(claim.key)
    return written


def release(message: Message | Buffer, store: Stores) -> Claim | None:
    """Delete the payload a reference names: call it after the consumer committed (the safe order).

    Consume, commit your output and the message's offset/acknowledgement,
    then release: a crash before the commit leaves the payload for the
    redelivered message; a crash after it leaves at most an orphan (which a
    sweep removes), never a message whose payload is gone. The reference is
    verified and its store checked against ``store`` (one store or an
    allowlist) as :func:`resolve` does. Idempotent: releasing twice, or a
    payload already gone, is not an error. Returns the claim released, or None
    for an inline message (nothing stored).

    ``message``: the reference (a :class:`Message` or its body bytes) whose payload is deleted.
    """
    claim = _claim_of(message)
    if claim is None:
        return None
    _store_for(claim, store).delete(claim.key)
    return claim
