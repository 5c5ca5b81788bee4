"""Whether a secret-scanning report is one to answer: signed by one of the code host's keys
(else 401 or 403; 503 when the host's callable gives a PEM that is no such key), and a JSON
array of candidates (else 400). Each refusal is raised as a :class:`_Refusal`, which the
responder (``leaks/_responder.py``) answers; a callable's key is asked as a ``PublicKeyOf``
step.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from collections.abc import Callable, Generator, Mapping
from typing import Any, Final, NamedTuple, TypeGuard

try:
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "keyturn.leaks needs the cryptography library: pip install 'keyturn[leaks]'"
    ) from exc

from keyturn._core.steps import PublicKeyOf, Step
from keyturn.errors import loggable

log: Final = logging.getLogger("keyturn.leaks")

KEY_ID_HEADER: Final = "github-public-key-identifier"
SIGNATURE_HEADER: Final = "github-public-key-signature"
_SURROGATE: Final = re.compile("[\ud800-\udfff]")  # JSON escapes can spell lone ones

PublicKeys = Mapping[str, str | bytes] | Callable[[str], str | bytes | None]


class _Refusal(Exception):
    """A report refused; its args are the status, code and message of the answer."""


def github_public_keys(document: str | bytes) -> dict[str, str]:
    """Identifier -> PEM from GitHub's published secret-scanning public keys document.

    The document is ``{"public_keys": [{"key_identifier": ..., "key": ..., ...}]}``; fetch
    and refresh it yourself (keyturn makes no outgoing requests).

    :raises ValueError: the document does not have that shape.
    """
    try:
        entries = json.loads(document)["public_keys"]
        keys = {entry["key_identifier"]: entry["key"] for entry in entries}
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(
            "not a public keys document: expected {'public_keys': [{'key_identifier', 'key'}]}"
        ) from exc
    if not all(isinstance(value, str) for pair in keys.items() for value in pair):
        raise ValueError("key_identifier and key must be strings")
    return keys


def _load(pem: str | bytes) -> ec.EllipticCurvePublicKey:
    key = serialization.load_pem_public_key(pem.encode("ascii") if isinstance(pem, str) else pem)
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise ValueError("a secret-scanning public key must be an ECDSA P-256 key")
    return key


class Signers:
    """The code host's public keys: loaded at once from a mapping, or asked of its callable
    for each report (a ``PublicKeyOf`` step, answered by :attr:`public_key`)."""

    def __init__(self, public_keys: PublicKeys) -> None:
        self.loaded = isinstance(public_keys, Mapping)
        if isinstance(public_keys, Mapping):
            # Loaded now: a bad key is a startup error, not a 503 on the first report.
            loaded = {identifier: _load(pem) for identifier, pem in public_keys.items()}
            self.public_key: Callable[[str], Any] = loaded.get
        elif callable(public_keys):
            self.public_key = public_keys
        else:
            raise TypeError("public_keys must be a mapping of identifier to PEM, or a callable")

    def verify(self, headers: Mapping[str, list[str]], body: bytes) -> Generator[Step, Any, None]:
        """Raise a :class:`_Refusal` unless *body* is signed by one of the host's keys."""
        identifiers = headers.get(KEY_ID_HEADER, [])
        signatures = headers.get(SIGNATURE_HEADER, [])
        if len(identifiers) != 1 or len(signatures) != 1 or not identifiers[0]:
            raise _Refusal(
                401, "unauthorized", "Sign the body: send one key identifier and one signature."
            )
        try:
            signature = base64.b64decode(signatures[0], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _Refusal(401, "unauthorized", "The signature is not base64.") from exc
        identifier = identifiers[0]
        named = loggable(identifier, 100)
        if self.loaded:
            key = self.public_key(identifier)
        else:
            pem = yield PublicKeyOf(identifier)
            try:
                key = None if pem is None else _load(pem)
            except (ValueError, TypeError, UnsupportedAlgorithm):
                log.error("public_keys gave an unusable key for identifier %s", named)
                raise _Refusal(503, "service_unavailable", "Try again later.") from None
        if key is None:
            log.warning("secret-scanning report signed by unknown key %s", named)
            raise _Refusal(403, "forbidden", "Unknown signing key.")
        try:
            key.verify(signature, body, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature as exc:
            log.warning("secret-scanning report with a bad signature (key %s)", named)
            raise _Refusal(403, "forbidden", "The signature does not verify.") from exc


class Candidate(NamedTuple):
    """One string the code host found in public, and where."""

    token: str
    type: str
    url: str
    source: str | None


def candidates(body: bytes) -> list[Candidate]:
    """The batch a report's body holds; a :class:`_Refusal` (400) when it holds no batch."""
    try:
        batch = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _invalid("The body is not JSON.") from exc
    except RecursionError as exc:  # deeper than Python's stack: no batch of candidates is
        raise _invalid("The body nests JSON too deeply: send an array of candidates.") from exc
    if not isinstance(batch, list):
        raise _invalid("The body must be a JSON array of candidates.")
    found = []
    for index, item in enumerate(batch):
        fields = item if isinstance(item, dict) else {}
        token, kind, url, source = (fields.get(n) for n in ("token", "type", "url", "source"))
        if not (_text(token) and _text(kind) and _text(url) and (source is None or _text(source))):
            raise _invalid(f"Candidate {index} must be an object with string token, type and url.")
        found.append(Candidate(token, kind, url, source))
    return found


def _invalid(message: str) -> _Refusal:
    return _Refusal(400, "invalid_request", message)


def _text(value: object) -> TypeGuard[str]:
    """A JSON string that is also valid Unicode."""
    return isinstance(value, str) and not _SURROGATE.search(value)
