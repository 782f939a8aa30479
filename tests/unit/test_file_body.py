"""A file's body as it arrives (bridge/protocol/file_body.py): the limit
counted while reading, a body cut short, a hash that does not match, and
streaming decryption of what nio's encrypt_attachment produces."""

from __future__ import annotations

import hashlib
import os
import random

import pytest
from nio.crypto.attachments import encrypt_attachment

from bridge.protocol.file_body import BodyCutShort, BodyTooLarge, BodyUndecryptable, FileBody
from bridge.protocol.file_problems import file_problem, size_words

MIB = 1024 * 1024


def chunks_of(data: bytes, seed: int) -> list[bytes]:
    """``data`` cut at random places, as a network delivers it (empty chunks too)."""
    rng = random.Random(seed)
    out, at = [], 0
    while at < len(data):
        size = rng.choice([0, 1, 7, 4096, 65536, 200_000])
        out.append(data[at:at + size])
        at += size
    return out


def fed(body: FileBody, chunks: list[bytes]) -> bytes:
    return b"".join(body.take(chunk) for chunk in chunks) + body.end()


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 70_000, 1_400_000])
def test_a_plain_body_passes_through_whole(size: int) -> None:
    data = os.urandom(size)
    body = FileBody(limit=2 * MIB)
    body.expect(size)
    assert fed(body, chunks_of(data, size)) == data
    assert body.received == size


@pytest.mark.parametrize("size", [1, 16, 1000, 70_000, 3 * MIB + 5])
def test_an_encrypted_body_is_decrypted_as_it_streams(size: int) -> None:
    data = os.urandom(size)
    ciphertext, keys = encrypt_attachment(data)
    body = FileBody(limit=4 * MIB, file={**keys, "url": "mxc://hs/x"})
    body.expect(len(ciphertext))
    out = fed(body, chunks_of(ciphertext, size))
    assert hashlib.sha256(out).digest() == hashlib.sha256(data).digest()


def test_exactly_the_limit_is_kept_and_one_byte_more_is_not() -> None:
    data = os.urandom(1000)
    assert fed(FileBody(limit=1000), chunks_of(data, 1)) == data
    body = FileBody(limit=999)
    with pytest.raises(BodyTooLarge):
        fed(body, chunks_of(data, 1))


def test_a_body_past_the_limit_is_refused_whatever_content_length_said() -> None:
    body = FileBody(limit=100)
    body.expect(50)  # the homeserver announced 50 bytes, then sent more
    body.take(b"x" * 100)
    with pytest.raises(BodyTooLarge):
        body.take(b"x")


def test_an_announced_length_past_the_limit_is_refused_before_reading() -> None:
    with pytest.raises(BodyTooLarge):
        FileBody(limit=100).expect(101)
    # Lengths that are no promise change nothing.
    body = FileBody(limit=100)
    for length in (None, "101", -1, True, 1.5):
        body.expect(length)
    assert body.promised == 0


@pytest.mark.parametrize("promised_by", ["content_length", "info_size"])
def test_a_body_shorter_than_promised_is_cut_short(promised_by: str) -> None:
    data = os.urandom(10_000)
    body = FileBody(limit=MIB)
    body.expect(len(data) if promised_by == "content_length" else None)
    if promised_by == "info_size":  # and no length from the homeserver
        body.announce(len(data))
    else:
        body.expect(5000)
    for chunk in chunks_of(data[:len(data) // 2], 3):
        body.take(chunk)
    with pytest.raises(BodyCutShort, match="5000 of (the )?10000"):
        body.end()


def test_a_body_whole_by_the_homeservers_length_or_its_hash_is_kept_whatever_info_size_claimed() -> None:
    """A client that counted the file wrong: the homeserver's copy arrived whole
    (its Content-Length, or its ciphertext's hash).  Refused as "cut short",
    the person was asked to send it again, which sends the same claim."""
    data = os.urandom(10_000)
    plain = FileBody(limit=MIB)
    plain.announce(len(data) + 512)
    plain.expect(len(data))
    for chunk in chunks_of(data, 3):
        plain.take(chunk)
    assert plain.end() == b""
    ciphertext, keys = encrypt_attachment(data)
    sealed = FileBody(limit=MIB, file=keys)
    sealed.announce(len(data) + 512)
    kept = b"".join(sealed.take(chunk) for chunk in chunks_of(ciphertext, 3)) + sealed.end()
    assert kept == data
    cut = FileBody(limit=MIB, file=keys)
    cut.announce(len(data))
    cut.take(ciphertext[:4000])
    with pytest.raises(BodyCutShort):  # short of the claim and not whole by its hash: tried again
        cut.end()


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "encrypted"])
def test_a_small_file_whose_client_claimed_past_the_limit_is_kept_not_called_too_large(sealed: bool) -> None:
    """A client's ``info.size`` of the limit + 1 on a 1,000-byte file: refused
    at once as "larger than the 5 MB an answer may carry", nothing downloaded."""
    data = os.urandom(1000)
    ciphertext, keys = encrypt_attachment(data) if sealed else (data, None)
    body = FileBody(limit=5 * MIB, file=keys)
    body.announce(5 * MIB + 1)
    body.expect(len(ciphertext))
    assert b"".join(body.take(chunk) for chunk in chunks_of(ciphertext, 3)) + body.end() == data


def test_an_encrypted_body_whole_by_the_homeservers_length_with_a_bad_hash_is_undecryptable_not_cut_short() -> None:
    """Its ``info.size`` overstated: it was called "not downloaded whole" and
    fetched three times, where the same file with a true size is "could not be
    decrypted"."""
    ciphertext, keys = encrypt_attachment(os.urandom(20_000))
    flipped = bytes([ciphertext[0] ^ 1]) + ciphertext[1:]
    body = FileBody(limit=MIB, file=keys)
    body.announce(len(ciphertext) + 1000)
    body.expect(len(ciphertext))
    body.take(flipped)
    with pytest.raises(BodyUndecryptable, match="sha256"):
        body.end()


def test_an_encrypted_body_cut_short_is_cut_short_not_a_bad_hash() -> None:
    ciphertext, keys = encrypt_attachment(os.urandom(5000))
    body = FileBody(limit=MIB, file=keys)
    body.expect(len(ciphertext))
    body.take(ciphertext[:2500])
    with pytest.raises(BodyCutShort):
        body.end()


def test_a_hash_that_does_not_match_is_undecryptable() -> None:
    ciphertext, keys = encrypt_attachment(os.urandom(5000))
    flipped = bytes([ciphertext[0] ^ 1]) + ciphertext[1:]
    body = FileBody(limit=MIB, file=keys)
    body.take(flipped)
    with pytest.raises(BodyUndecryptable, match="sha256"):
        body.end()
    _other, other_keys = encrypt_attachment(b"another file")
    body = FileBody(limit=MIB, file={**keys, "hashes": other_keys["hashes"]})
    body.take(ciphertext)
    with pytest.raises(BodyUndecryptable):
        body.end()


@pytest.mark.parametrize("broken", [
    lambda k: {**k, "key": "not a dict"},
    lambda k: {**k, "hashes": None},
    lambda k: {**k, "iv": "!!!"},
    lambda k: {**k, "iv": k["iv"][:10]},
    lambda k: {**k, "key": {**k["key"], "k": k["key"]["k"][:20]}},
    lambda k: {**k, "key": {**k["key"], "alg": "A128CBC"}},
    lambda k: {**k, "hashes": {"sha256": 12}},
])
def test_a_malformed_key_is_undecryptable_before_anything_is_read(broken) -> None:
    _ciphertext, keys = encrypt_attachment(b"data")
    with pytest.raises(BodyUndecryptable):
        FileBody(limit=MIB, file=broken(keys))


def test_the_word_back_names_the_file_and_the_limit() -> None:
    assert size_words(20 * MIB) == "20 MB" and size_words(12 * MIB + MIB // 2) == "12.5 MB"
    assert size_words(512 * 1024) == "512 KB"
    # Under a MB: never a figure below the limit (2000 bytes read "1 KB").
    assert (size_words(2000), size_words(500)) == ("1.95 KB", "500 bytes")
    words = file_problem("attachment_too_large", "release-shot.png", 12 * MIB)
    assert words == "The file “release-shot.png” is larger than the 12 MB an answer may carry."
    assert "“clip.mp4”" in file_problem("attachment_not_fetched", "clip.mp4")
    # A name is shown without control or direction marks, and clipped.
    assert "\u202e" not in file_problem("attachment_encrypted", "\u202egnp.exe")
    assert len(file_problem("attachment_not_saved", "a" * 500)) < 200
    assert file_problem("attachment_download_failed", None).startswith("The file could not be downloaded")
