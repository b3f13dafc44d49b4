"""Cumulative chunk hashes of a prompt: the only thing the Chunked Hash Tree compares.

Chunk k of a prompt (tokens [k*C, (k+1)*C)) gets h_k = BLAKE2b-128(h_{k-1} || tokens of
chunk k), with h_{-1} = b"". Equal h_k therefore means equal first (k+1)*C tokens (up to a
2^-128 collision chance), which is what lets the tree skip token comparisons. Only full chunks
are hashed: a partial last chunk cannot be shared as a KV block either.

Engines compute their own block hashes the same way (vLLM: sha256 of parent hash + block
tokens); pass those instead (`ChunkedHashTree.add_waiting(..., chunk_hashes=...)`) so nothing
is hashed twice. Never mix the two schemes in one tree.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable

DIGEST_BYTES = 16


def token_array(token_ids: Iterable[int], *, what: str = "token_ids") -> array:
    """Token ids as a compact unsigned 32-bit array; a clear error for anything else."""
    if isinstance(token_ids, (str, bytes, bytearray)):
        raise TypeError(f"{what} must be a sequence of integer token ids, got {type(token_ids)!r}")
    try:
        return array("I", token_ids)
    except TypeError as exc:
        raise TypeError(f"{what} must contain only integer token ids ({exc})") from exc
    except OverflowError as exc:
        raise ValueError(f"{what} must be token ids in [0, 2**32) ({exc})") from exc


def _token_bytes(token_ids: Iterable[int]) -> bytes:
    """Native unsigned 32-bit bytes of the token ids (numpy arrays without a Python loop)."""
    dtype = getattr(token_ids, "dtype", None)
    if dtype is not None and getattr(token_ids, "ndim", 0) == 1 and dtype.kind in "iu":
        if len(token_ids) and (token_ids.min() < 0 or token_ids.max() >= 2**32):
            raise ValueError("token_ids must be token ids in [0, 2**32)")
        return token_ids.astype("=u4", copy=False).tobytes()
    return token_array(token_ids).tobytes()


def chunk_hashes(token_ids: Iterable[int], chunk_size: int, parent: bytes = b"") -> list[bytes]:
    """The cumulative hashes of the full `chunk_size`-token chunks of a prompt.

    `parent` continues a chain: the hashes of tokens[k*C:] given the hash of chunk k-1.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    data = _token_bytes(token_ids)
    step = chunk_size * 4
    usable = len(data) - len(data) % step
    blake2b = hashlib.blake2b
    out: list[bytes] = []
    previous = parent
    for start in range(0, usable, step):
        previous = blake2b(previous + data[start : start + step], digest_size=DIGEST_BYTES).digest()
        out.append(previous)
    return out
