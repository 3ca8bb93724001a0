"""API keys: how they are hashed for the tenants file, and how a presented key is checked.

The tenants file stores only hashes. Two forms are accepted:

- ``sha256:<64 hex>`` — the default. API keys made by `new_key` carry 256 random bits, so a
  fast hash is as strong as a slow one against guessing and costs nothing per request.
- ``scrypt:<n>:<r>:<p>:<salt b64>:<hash b64>`` — for keys chosen by people. Each check costs
  one scrypt per scrypt entry, so the registry caches keys it has already accepted.

Comparisons use `hmac.compare_digest`, so timing does not reveal how much of a hash matched.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from typing import Literal

__all__ = ["KeyHash", "hash_key", "new_key", "parse_key_hash", "sha256_of"]

_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
_SCRYPT = re.compile(r"scrypt:(\d+):(\d+):(\d+):([A-Za-z0-9+/=]+):([A-Za-z0-9+/=]+)")
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
_MAX_SCRYPT_N = 2**20


def new_key() -> str:
    """A fresh random API key (256 bits, URL-safe)."""
    return "ptc_" + secrets.token_urlsafe(32)


def sha256_of(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def _scrypt(key: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        key.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=256 * n * r + (1 << 20), dklen=32
    )


def hash_key(key: str, scheme: Literal["sha256", "scrypt"] = "sha256") -> str:
    """The form to put in the tenants file for ``key``."""
    if scheme == "sha256":
        return sha256_of(key)
    salt = secrets.token_bytes(16)
    digest = _scrypt(key, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return (
        f"scrypt:{SCRYPT_N}:{SCRYPT_R}:{SCRYPT_P}:"
        f"{base64.b64encode(salt).decode()}:{base64.b64encode(digest).decode()}"
    )


class KeyHash:
    """A parsed key hash that can check a presented key."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.scheme: Literal["sha256", "scrypt"] = "sha256"
        self._params = (0, 0, 0)
        self._salt = b""
        self._digest = b""
        if _SHA256.fullmatch(text):
            return
        match = _SCRYPT.fullmatch(text)
        if match is None:
            raise ValueError(
                "is not a key hash (expected sha256:<64 hex> or scrypt:n:r:p:salt:hash; "
                "store only hashes, made with `ptc tenants hash-key`)"
            )
        n, r, p = (int(match.group(i)) for i in (1, 2, 3))
        if n < 2 or n & (n - 1) or n > _MAX_SCRYPT_N or not 1 <= r <= 64 or not 1 <= p <= 16:
            raise ValueError(f"has unusable scrypt parameters n={n} r={r} p={p}")
        try:
            self._salt = base64.b64decode(match.group(4), validate=True)
            self._digest = base64.b64decode(match.group(5), validate=True)
        except ValueError:
            raise ValueError("has a salt or hash that is not base64") from None
        self.scheme, self._params = "scrypt", (n, r, p)

    def matches(self, key: str) -> bool:
        if self.scheme == "sha256":
            return hmac.compare_digest(sha256_of(key), self.text)
        n, r, p = self._params
        return hmac.compare_digest(_scrypt(key, self._salt, n, r, p), self._digest)


def parse_key_hash(text: str) -> KeyHash:
    return KeyHash(text)
