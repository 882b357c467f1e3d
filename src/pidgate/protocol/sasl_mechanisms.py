"""What one SASL token says: pure readers for the PLAIN, SCRAM and OAUTHBEARER client messages.

Owns the per-mechanism token grammars pidgate needs to learn *which name a client claims*:
PLAIN's ``authzid NUL authcid NUL passwd`` (RFC 4616), SCRAM's client-first-message with its
GS2 header and ``=2C``/``=3D`` name escaping (RFC 5802), OAUTHBEARER's initial client response
(RFC 7628) and the unverified JWT claim inside it, and the server tokens that end a SCRAM or
OAUTHBEARER exchange. The exchange state machine lives in ``pidgate.protocol.sasl``.

Nothing here authenticates anyone (the broker does) and nothing here keeps a credential: readers
return only the claimed name and a flag, never the password, SCRAM proof or token, and they
never raise on bad input; an unreadable token simply yields no name (``None``). Must not import:
asyncio, socket, time, logging, structlog, prometheus_client, or any other pidgate package.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
OAUTHBEARER = "OAUTHBEARER"
SCRAM_MECHANISMS = frozenset({SCRAM_SHA_256, SCRAM_SHA_512})

#: RFC 7628 section 3.1: kvsep, the separator of OAUTHBEARER key/value pairs.
KVSEP = b"\x01"


@dataclass(frozen=True, slots=True)
class ClaimedIdentity:
    """The name a client's first SASL message claims, before the broker has said anything.

    ``user`` is the authentication identity (PLAIN authcid, SCRAM ``n=``, the JWT claim), or
    None when it cannot be read. ``authzid_mismatch`` is True when the client also asked for a
    different authorization identity: Kafka's PLAIN, SCRAM and OAUTHBEARER servers all reject
    that ("Client requested an authorization id that is different from ..."), and pidgate never
    uses the authzid as the user either way.
    """

    user: str | None
    authzid_mismatch: bool = False


UNREADABLE = ClaimedIdentity(None)


def _utf8(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


# -- PLAIN (RFC 4616) -----------------------------------------------------------------------------


def read_plain(token: bytes | memoryview) -> ClaimedIdentity:
    """``[authzid] NUL authcid NUL passwd``: the user is authcid, never authzid.

    Kafka's PlainSaslServer splits the message on NUL and demands exactly three parts and a
    non-empty authcid; so do we. The password part is dropped unread.
    """
    parts = bytes(token).split(b"\x00")
    if len(parts) != 3:
        return UNREADABLE
    authzid_raw, authcid_raw = parts[0], parts[1]
    authcid = _utf8(authcid_raw)
    if not authcid:
        return UNREADABLE
    if not authzid_raw:
        return ClaimedIdentity(authcid)
    # kafka-python and aiokafka send authzid == authcid; librdkafka sends an empty authzid.
    return ClaimedIdentity(authcid, authzid_mismatch=_utf8(authzid_raw) != authcid)


# -- SCRAM (RFC 5802) -----------------------------------------------------------------------------

# RFC 5802 section 5.1 "saslname": any UTF-8 except NUL, ',' and '=', with ',' and '=' written
# as "=2C" and "=3D". Kafka's ScramMessages is stricter (ASCII only), so every name Kafka accepts
# also parses here; a name only we accept can never have been accepted by a Kafka broker.
_SASLNAME = re.compile(r"(?:[^\x00,=]|=2C|=3D)+")


def scram_unescape(saslname: str) -> str | None:
    """Undo RFC 5802's ``=2C``/``=3D`` escaping; None if ``saslname`` is not a valid saslname."""
    if not _SASLNAME.fullmatch(saslname):
        return None
    # One left-to-right pass, so "=3D2C" becomes "=2C", not ",".
    return re.sub(r"=2C|=3D", lambda m: "," if m.group() == "=2C" else "=", saslname)


def looks_like_scram_client_first(token: bytes | memoryview) -> bool:
    """A GS2 header starts every client-first-message (``n,`` / ``y,`` / ``p=``); the
    client-final-message starts with ``c=`` (RFC 5802 section 7)."""
    head = bytes(token[:2])
    return head in (b"n,", b"y,", b"p=")


def _gs2_header(token: bytes | memoryview) -> tuple[str | None, str] | None:
    """Split RFC 5802/7628's ``gs2-cbind-flag "," [authzid] ","`` off the UTF-8 text of
    ``token``.

    Returns (authzid or None, rest), or None when the token is not UTF-8 or the header is
    malformed (including a bad authzid escape).
    """
    text = _utf8(bytes(token))
    if text is None:
        return None
    flag, sep, rest = text.partition(",")
    if not sep or not (flag in ("n", "y") or flag.startswith("p=")):
        return None
    authzid_field, sep, rest = rest.partition(",")
    if not sep:
        return None
    if not authzid_field:
        return None, rest
    if not authzid_field.startswith("a="):
        return None
    authzid = scram_unescape(authzid_field[2:])
    if authzid is None:
        return None
    return authzid, rest


def read_scram_client_first(token: bytes | memoryview) -> ClaimedIdentity:
    """``gs2-header [m=...,] n=<saslname>,r=<nonce>[,extensions]``: the user is the unescaped
    ``n=`` name, never the GS2 ``a=`` authzid.

    Requires ``,r=`` right after the name, as Kafka's ScramMessages regex does: kafka-python
    3.0 does not escape names, and its ``n=a,b=c,r=...`` must not read as user "a".
    """
    header = _gs2_header(token)
    if header is None:
        return UNREADABLE
    authzid, bare = header
    if bare.startswith("m="):  # reserved-mext (RFC 5802 section 5.1); Kafka's regex allows it
        _, sep, bare = bare.partition(",")
        if not sep:
            return UNREADABLE
    fields = bare.split(",")
    if len(fields) < 2 or not fields[0].startswith("n=") or not fields[1].startswith("r="):
        return UNREADABLE
    if len(fields[1]) <= 2:  # empty nonce
        return UNREADABLE
    user = scram_unescape(fields[0][2:])
    if user is None:
        return UNREADABLE
    return ClaimedIdentity(user, authzid_mismatch=authzid is not None and authzid != user)


# -- OAUTHBEARER (RFC 7628) -----------------------------------------------------------------------

# Kafka's OAuthBearerClientInitialResponse: KEY = [A-Za-z]+, VALUE = [\x21-\x7E \t\r\n]+,
# and "auth" = scheme, spaces, then a token of [-_.a-zA-Z0-9]+ (RFC 6750's b64token, less '+/=').
_KEY = re.compile(r"[A-Za-z]+")
_VALUE = re.compile(r"[\x21-\x7E \t\r\n]+")
_AUTH = re.compile(r"([A-Za-z0-9_]+) +([-_.a-zA-Z0-9]+)")


def read_oauthbearer(token: bytes | memoryview, claim: str) -> ClaimedIdentity:
    """``gs2-header kvsep *(key=value kvsep) kvsep`` with ``auth=Bearer <jwt>``: the user is the
    JWT payload's ``claim`` (a non-blank string), decoded but NOT verified (the broker verifies
    the signature, expiry and scope; a name it rejects never takes effect)."""
    header = _gs2_header(token)
    if header is None:
        return UNREADABLE
    authzid, rest = header
    if not rest.startswith("\x01") or not rest.endswith("\x01\x01") or len(rest) < 3:
        return UNREADABLE
    auth_values: list[str] = []
    for pair in rest[1:-2].split("\x01"):
        key, sep, value = pair.partition("=")
        if not sep or not _KEY.fullmatch(key) or not _VALUE.fullmatch(value):
            return UNREADABLE
        if key == "auth":
            auth_values.append(value)
    if len(auth_values) != 1:
        return UNREADABLE
    m = _AUTH.fullmatch(auth_values[0])
    if m is None or m.group(1).lower() != "bearer":
        return UNREADABLE
    user = jwt_claim(m.group(2), claim)
    mismatch = authzid is not None and authzid != user
    return ClaimedIdentity(user, authzid_mismatch=mismatch)


def jwt_claim(jwt: str, claim: str) -> str | None:
    """The string value of top-level ``claim`` in a compact JWS's payload, unverified.

    None for anything else: not three dot-separated parts, bad base64url, not a JSON object,
    the claim missing, duplicated (JSON parsers disagree on which copy wins, so a duplicate
    could show pidgate one name and the broker another), not a string, or blank.
    """
    parts = jwt.split(".")
    if len(parts) != 3 or not parts[1]:
        return None
    payload = parts[1]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        text = raw.decode("utf-8")
        objects: list[list[tuple[str, Any]]] = []

        def keep_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            objects.append(pairs)
            return dict(pairs)

        decoded = json.loads(text, object_pairs_hook=keep_pairs)
    except (ValueError, RecursionError):
        # binascii.Error and UnicodeDecodeError are ValueErrors; RecursionError is deeply
        # nested JSON. Either way: unreadable, the proxy charges the fallback principal.
        return None
    if not isinstance(decoded, dict) or not objects:
        return None
    # The outermost object is completed (and so handed to the hook) last.
    values = [value for key, value in objects[-1] if key == claim]
    if len(values) != 1 or not isinstance(values[0], str) or not values[0].strip():
        return None
    return values[0]


def oauthbearer_server_error(token: bytes | memoryview) -> bool:
    """A non-empty server token in OAUTHBEARER is the RFC 7628 section 3.2.2 error JSON
    (``{"status": ...}``); success is an empty token."""
    return len(token) > 0
