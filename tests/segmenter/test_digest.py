"""SHA-256 / HMAC-SHA-256 header extension: codec, keyring, verification, the worked example, Spark SQL."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import itertools
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from segmenter.digest import (
    DigestPolicy,
    Digests,
    ExtensionType,
    Hasher,
    HmacTag,
    Keyring,
    KeyringError,
    hmac_pads,
    hmac_sha256_sql,
    parse_extension,
    sha256_sql,
    verify_sql,
)
from segmenter.errors import Reason, SegmentationError
from segmenter.wire import HEADER, decode_header

KEY_IDS = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=64)
KEYS = st.binary(min_size=16, max_size=200)
RING = Keyring({"2026-10": b"k" * 16, "2026-11": bytes(range(80))}, current="2026-11")
BOTH = DigestPolicy(sha256=True, keyring=RING)


def digests_strategy() -> st.SearchStrategy[Digests]:
    tags = st.builds(HmacTag, KEY_IDS, st.binary(min_size=32, max_size=32))
    return st.builds(Digests, st.none() | st.binary(min_size=32, max_size=32), st.none() | tags)


def record(kind: int, value: bytes) -> bytes:
    return struct.pack(">BH", kind, len(value)) + value


# -- the extension codec -------------------------------------------------------------------------


@given(digests_strategy())
def test_round_trip(digests: Digests) -> None:
    ext = digests.extension()
    assert parse_extension(ext) == digests
    assert parse_extension(memoryview(b"pad" + ext)[3:]) == digests
    assert bool(ext) == bool(digests)


@settings(max_examples=10)
@given(st.binary(max_size=3000), st.sampled_from(sorted(RING.keys)))
def test_every_single_bit_flip_is_detected(message: bytes, key_id: str) -> None:
    signer = DigestPolicy(sha256=True, keyring=Keyring(RING.keys, current=key_id))
    ext = signer.sign([message]).extension()
    BOTH.verify(parse_extension(ext), [message])
    for bit in range(8 * len(ext)):
        flipped = bytearray(ext)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(SegmentationError):
            BOTH.verify(parse_extension(bytes(flipped)), [message])


@settings(max_examples=10)
@given(st.binary(max_size=300))
def test_truncation_is_detected(message: bytes) -> None:
    ext = BOTH.sign([message]).extension()
    for end in range(len(ext)):
        with pytest.raises(SegmentationError):
            BOTH.verify(parse_extension(ext[:end]), [message])


def test_unknown_types_critical_refused_skippable_skipped() -> None:
    sha = hashlib.sha256(b"m").digest()
    known = record(ExtensionType.SHA256, sha)
    with pytest.raises(SegmentationError) as err:
        parse_extension(known + record(0x20, b"future"))
    assert err.value.reason == Reason.UNKNOWN_EXTENSION and err.value.details["type"] == 0x20
    skipped = known + record(0xC0, b"") + record(0xFF, bytes(300))
    assert parse_extension(skipped) == Digests(sha)
    assert parse_extension(record(0xC7, b"x")) == Digests()


@pytest.mark.parametrize(
    "ext",
    [
        record(ExtensionType.SHA256, bytes(32)) * 2,  # repeated
        record(0xC0, b"") + record(ExtensionType.SHA256, bytes(32)),  # out of order
        record(ExtensionType.SHA256, bytes(31)),
        record(ExtensionType.SHA256, bytes(33)),
        record(ExtensionType.HMAC_SHA256, bytes(32) + b"\x01"),  # key id length 1, key id missing
        record(ExtensionType.HMAC_SHA256, bytes(32) + b"\x00"),  # empty key id
        record(ExtensionType.HMAC_SHA256, bytes(32) + b"\x02a b"),  # key id length disagrees
        record(ExtensionType.HMAC_SHA256, bytes(32) + b"\x02a "),  # not printable
        record(ExtensionType.HMAC_SHA256, bytes(32) + b"\x01\xe9"),  # not ASCII
        record(ExtensionType.HMAC_SHA256, bytes(20)),
        record(ExtensionType.HMAC_SHA256, bytes(32) + b"\x41" + b"k" * 65),  # key id longer than 64
        b"\x11\x00",  # a record header cut short
        b"\x11\xff\xff" + bytes(10),  # a length past the end
        bytes(5000),  # longer than any header allows
        record(0x00, b""),  # type 0 is never assigned
    ],
)
def test_malformed_extensions(ext: bytes) -> None:
    with pytest.raises(SegmentationError) as err:
        parse_extension(ext)
    assert err.value.reason in (Reason.EXTENSION_ERROR, Reason.UNKNOWN_EXTENSION)


def test_type_codes_are_two_flips_apart_and_critical() -> None:
    codes = [int(t) for t in ExtensionType]
    assert all(bin(c).count("1") % 2 == 0 and c < 0xC0 for c in codes)
    for code in codes:  # no single flip reaches another known code or the skippable range
        flips = {code ^ (1 << b) for b in range(8)}
        assert not flips & set(codes) and all(f < 0xC0 for f in flips)


@given(st.binary(max_size=200))
@example(b"")
def test_fuzz_only_library_errors(data: bytes) -> None:
    try:
        digests = parse_extension(data)
    except SegmentationError:
        return
    assert parse_extension(digests.extension()) == digests
    for policy in (BOTH, DigestPolicy(), DigestPolicy(keyring=RING)):
        with contextlib.suppress(SegmentationError):
            policy.verify(digests, [data])


@given(st.data())
def test_fuzz_mutated_valid_extensions(data: st.DataObject) -> None:
    ext = bytearray(BOTH.sign([b"payload"]).extension())
    for _ in range(data.draw(st.integers(1, 4))):
        ext[data.draw(st.integers(0, len(ext) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(ext)))
    try:
        BOTH.verify(parse_extension(bytes(ext[:cut])), [b"payload"])
    except SegmentationError:
        return
    assert bytes(ext[:cut]) == BOTH.sign([b"payload"]).extension()  # only the original verifies


# -- hashing, keys, policies ---------------------------------------------------------------------


@given(st.binary(max_size=5000), st.lists(st.integers(0, 5000), max_size=6), KEYS, KEY_IDS)
def test_incremental_equals_one_shot(message: bytes, cuts: list[int], key: bytes, key_id: str) -> None:
    bounds = [0, *sorted(min(c, len(message)) for c in cuts), len(message)]
    chunks = [memoryview(message)[a:b] for a, b in itertools.pairwise(bounds)]
    signed = DigestPolicy(sha256=True, keyring=Keyring({key_id: key}, current=key_id)).sign(chunks)
    assert signed.sha256 == hashlib.sha256(message).digest()
    assert signed.hmac == HmacTag(key_id, hmac.new(key, message, hashlib.sha256).digest())


def test_policy_writes_what_it_is_configured_for() -> None:
    assert DigestPolicy().sign([b"x"]) == Digests()
    assert DigestPolicy().extension_size() == 0
    only_sha = DigestPolicy(sha256=True)
    assert only_sha.sign([b"x"]).hmac is None and only_sha.extension_size() == 35
    verify_only = DigestPolicy(keyring=Keyring(RING.keys))  # no current key: a reader's ring
    assert verify_only.sign([b"x"]) == Digests() and verify_only.extension_size() == 0
    assert len(BOTH.sign([b"x"]).extension()) == BOTH.extension_size() == 35 + 3 + 33 + len("2026-11")


def test_wrong_key_and_unknown_key_id() -> None:
    signed = BOTH.sign([b"message"])
    assert signed.hmac is not None
    forged_ring = Keyring({"2026-11": b"another key of 16+ bytes"})
    with pytest.raises(SegmentationError) as err:
        DigestPolicy(keyring=forged_ring).verify(signed, [b"message"])
    assert err.value.reason == Reason.HMAC_MISMATCH
    with pytest.raises(KeyringError) as err:
        DigestPolicy(keyring=Keyring({"other": bytes(16)})).verify(signed, [b"message"])
    assert err.value.reason == Reason.UNKNOWN_KEY and err.value.details["key_id"] == "2026-11"
    with pytest.raises(SegmentationError) as err:
        BOTH.verify(signed, [b"messagf"])
    assert err.value.reason == Reason.DIGEST_MISMATCH  # SHA-256 is checked first


def test_key_rotation() -> None:
    october = Keyring({"2026-10": b"k" * 16}, current="2026-10")
    old = DigestPolicy(keyring=october).sign([b"m"])
    new = DigestPolicy(keyring=RING).sign([b"m"])
    assert old.hmac is not None and new.hmac is not None and old.hmac.key_id != new.hmac.key_id
    for signed in (old, new):  # the rotated ring verifies both generations
        DigestPolicy(keyring=RING).verify(signed, [b"m"])
    retired = Keyring({"2026-11": RING.key("2026-11")})
    DigestPolicy(keyring=retired).verify(new, [b"m"])
    with pytest.raises(KeyringError):
        DigestPolicy(keyring=retired).verify(old, [b"m"])


def test_reader_demands() -> None:
    sha_only = DigestPolicy(sha256=True).sign([b"m"])
    for policy, declared in ((DigestPolicy(sha256=True), Digests()), (DigestPolicy(keyring=RING), sha_only)):
        with pytest.raises(SegmentationError) as err:
            policy.verify(declared, [b"m"])
        assert err.value.reason == Reason.DIGEST_MISSING
    # A reader without a keyring cannot check a tag: it checks the SHA-256 and ignores the tag.
    DigestPolicy().verify(BOTH.sign([b"m"]), [b"m"])
    with pytest.raises(SegmentationError):
        DigestPolicy().verify(BOTH.sign([b"m"]), [b"n"])


@pytest.mark.parametrize(
    ("keys", "current"),
    [
        ({"k": b"short"}, None),
        ({"a b": bytes(16)}, None),
        ({"": bytes(16)}, None),
        ({"x" * 65: bytes(16)}, None),
        ({"é": bytes(16)}, None),
        ({"k": bytes(16)}, "other"),
    ],
)
def test_keyring_configuration_refused(keys: dict[str, bytes], current: str | None) -> None:
    with pytest.raises(KeyringError):
        Keyring(keys, current=current)


def test_keyring_never_shows_keys() -> None:
    secret = b"very secret key material"
    ring = Keyring({"k": secret}, current="k")
    assert secret.hex() not in repr(ring) and repr(secret) not in repr(ring)
    assert secret.hex() not in repr(DigestPolicy(keyring=ring)) and repr(secret) not in repr(DigestPolicy(keyring=ring))


@given(st.binary(max_size=300), st.binary(max_size=300))
@example(b"msg", bytes(64))
@example(b"msg", bytes(65))
def test_padded_keys_give_hmac(message: bytes, key: bytes) -> None:
    inner, outer = hmac_pads(key)
    nested = hashlib.sha256(outer + hashlib.sha256(inner + message).digest()).digest()
    assert nested == hmac.new(key, message, hashlib.sha256).digest()


def test_hasher_counts_bytes() -> None:
    hasher = Hasher(sha256=False)
    hasher.update(b"abc")
    hasher.update(memoryview(b"de"))
    assert hasher.length == 5 and hasher.digests() == Digests()


# -- the worked example of docs/concepts/wire-format.md ---------------------------------------------------

EXAMPLE_KEY = bytes(range(32))
EXAMPLE_SHA256 = "7c0f2efeacb1f77177f1c720e301065e510d8832286ebb96c7cddb926a207565"
EXAMPLE_TAG = "174986cec35fddc51dd8996c7aed61254b8e752b9331e279f5d1424d99728c5b"
EXAMPLE_EXTENSION = (
    "110020" + EXAMPLE_SHA256 + "120026" + EXAMPLE_TAG + "05" + "6b32303236"  # "k2026"
)
EXAMPLE_HEADER = (
    "53474d540101000100a00000000000040001020304050607"
    "08090a0b0c0d0e0f1011121314151617000000010000000700000000000000100000000000000017"
    "00000000000000179297dfa9b613e545" + EXAMPLE_EXTENSION + "1075e947"
)


def test_worked_example() -> None:
    message = b"Hello, segmented world!"
    policy = DigestPolicy(sha256=True, keyring=Keyring({"k2026": EXAMPLE_KEY}, current="k2026"))
    digests = policy.sign([message])
    assert digests.extension().hex() == EXAMPLE_EXTENSION
    assert digests == Digests(bytes.fromhex(EXAMPLE_SHA256), HmacTag("k2026", bytes.fromhex(EXAMPLE_TAG)))
    # The last segment of the wire-format example, its 80 fixed bytes built from the documented layout.
    header_length = 84 + len(digests.extension())
    fixed = HEADER.pack(b"SGMT", 1, 1, 0, 1, header_length, 0, 4, bytes(range(24)), 1, 7, 16, 23, 23,
                        0x9297DFA9, 0xB613E545)  # fmt: skip
    head = fixed + digests.extension()
    header = head + zlib.crc32(head).to_bytes(4, "big")
    assert header.hex() == EXAMPLE_HEADER and header_length == 160
    decoded = decode_header(header + b" world!")  # today's reader skips the extension
    assert decoded.header_length == 160 and decoded.is_last_segment
    policy.verify(parse_extension(header[80 : header_length - 4]), [message])
    doc = (Path(__file__).parents[2] / "docs" / "concepts" / "wire-format.md").read_text()
    flat = "".join(doc.split())
    for value in (EXAMPLE_SHA256, EXAMPLE_TAG, EXAMPLE_EXTENSION, EXAMPLE_HEADER):
        assert value in flat


# -- Spark: the JVM computes the same digests ----------------------------------------------------

LONG = bytes(range(256)) * 4096  # 1 MiB


@pytest.mark.spark
@settings(max_examples=3)
@given(
    st.lists(st.binary(max_size=2000), min_size=1, max_size=20),
    st.lists(st.binary(max_size=200), min_size=1, max_size=3),
)
@example([b"", b"abc", LONG], [b"", bytes(64), bytes(range(65)), b"k" * 200])
def test_spark_sql_equals_hashlib(spark: Any, messages: list[bytes], keys: list[bytes]) -> None:
    df = spark.createDataFrame([(i, m) for i, m in enumerate(messages)], "i int, data binary")
    columns = [f"{sha256_sql('data')} AS sha"] + [f"{hmac_sha256_sql('data', k)} AS h{j}" for j, k in enumerate(keys)]
    rows = sorted(df.selectExpr("i", *columns).collect())
    for row, message in zip(rows, messages, strict=True):
        assert bytes(row["sha"]) == hashlib.sha256(message).digest()
        for j, key in enumerate(keys):
            assert bytes(row[f"h{j}"]) == hmac.new(key, message, hashlib.sha256).digest()


def _tampered_cases() -> list[tuple[bytes, bytes]]:
    """(message, extension) pairs: valid ones, tampered ones, and legal ones SQL leaves to Python."""
    other = Keyring({"2026-10": b"k" * 16}, current="2026-10")
    cases = []
    for message in (b"", b"abc", LONG[:100_000]):
        good = BOTH.sign([message])
        assert good.hmac is not None
        cases += [
            (message, good.extension()),
            (message, DigestPolicy(sha256=True, keyring=other).sign([message]).extension()),  # rotated key
            (message + b"!", good.extension()),
            (message, Digests(good.sha256, HmacTag(good.hmac.key_id, bytes(32))).extension()),
            (message, Digests(good.sha256, HmacTag("unknown", good.hmac.tag)).extension()),
            (message, Digests(None, good.hmac).extension()),  # SHA-256 demanded, missing
            (message, Digests(good.sha256).extension()),  # HMAC demanded, missing
            (message, b""),
            (message, good.extension()[:-1]),
            (message, good.extension() + b"\0"),
            (message, good.extension() + record(0xC0, b"")),  # legal; SQL says "not verified here"
        ]
        # key ids the wire forbids (parse_extension: 9030); SQL passed them and its path delivered
        for kid in (b"a ", b"a\x00", b"k" * 65, b"\xff\xfe"):
            forged = record(ExtensionType.HMAC_SHA256, good.hmac.tag + bytes([len(kid)]) + kid)
            cases.append((message, Digests(good.sha256).extension() + forged))
    return cases


def _python_verdict(message: bytes, ext: bytes, policy: DigestPolicy) -> bool:
    try:
        policy.verify(parse_extension(ext), [message])
    except SegmentationError:
        return False
    return True


@pytest.mark.spark
def test_spark_verify_sql_agrees_with_python(spark: Any) -> None:
    cases = _tampered_cases()
    df = spark.createDataFrame([(i, m, e) for i, (m, e) in enumerate(cases)], "i int, data binary, ext binary")
    policies = [BOTH, DigestPolicy(), DigestPolicy(sha256=True), DigestPolicy(keyring=RING)]
    columns = [f"{verify_sql('data', 'ext', p)} AS v{j}" for j, p in enumerate(policies)]
    rows = sorted(df.selectExpr("i", *columns).collect())
    for row, (message, ext) in zip(rows, cases, strict=True):
        for j, policy in enumerate(policies):
            expected = _python_verdict(message, ext, policy)
            skippable = ext.endswith(record(0xC0, b""))
            assert row[f"v{j}"] is (expected and not skippable), (row["i"], j)
