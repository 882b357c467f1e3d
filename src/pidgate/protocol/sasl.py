"""Observing a connection's SASL exchange (sans-IO): which user did the broker accept?

Owns ``SaslObserver`` (one per client connection), ``SaslClaim`` and ``SaslOutcome``, and the
decoding of SaslHandshake (api key 17, v0-v1) and SaslAuthenticate (api key 36, v0-v2) bodies.
pidgate NEVER authenticates anyone: the broker does. The observer only reads the exchange as it
passes through, and a claimed name takes effect (``authenticated``) only when the broker's answer
says the exchange succeeded, so a client can neither be charged to nor hide behind a name the
broker did not accept. It keeps no credential: no password, SCRAM proof or token is stored in any
field, repr or exception message (tokens are read by ``pidgate.protocol.sasl_mechanisms`` and
dropped). Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or
``pidgate.quota`` / ``pidgate.proxy`` / ``pidgate.config``.

The two framings (KIP-43, KIP-152):

- SaslHandshake v0: once the broker accepts the mechanism, client and broker exchange bare
  int32-size-prefixed tokens with no Kafka header until the exchange completes
  (``expects_raw_tokens``); a failure closes the connection.
- SaslHandshake v1: every token travels in a SaslAuthenticate request/response, whose error_code
  is the broker's verdict (non-zero, e.g. 58 SASL_AUTHENTICATION_FAILED, is failure) and whose
  v1+ session_lifetime_ms asks the client to re-authenticate (KIP-368) before it runs out.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from pidgate.protocol import sasl_mechanisms as mech
from pidgate.protocol._wire import (
    I16,
    I32,
    I64,
    as_memoryview,
    need,
    read_nullable_string,
    read_uvarint,
    skip_tagged_fields,
)
from pidgate.protocol.errors import MalformedMessageError, UnsupportedApiError
from pidgate.protocol.headers import parse_request_header

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
SASL_HANDSHAKE_VERSIONS = (0, 1)
"""SaslHandshake versions this module parses (v1, KIP-152: tokens move into SaslAuthenticate)."""
SASL_AUTHENTICATE_VERSIONS = (0, 2)
"""SaslAuthenticate versions this module parses (v1 adds session_lifetime_ms, KIP-368; v2 is
flexible, KIP-482)."""
_FIRST_FLEXIBLE_AUTHENTICATE = 2


@dataclass(frozen=True, slots=True)
class SaslClaim:
    """The mechanism of an exchange and the name its client claimed.

    ``user`` is the PLAIN authcid, the SCRAM ``n=`` name or the OAUTHBEARER JWT claim; None
    when pidgate cannot read it (GSSAPI, an unknown mechanism, a malformed token), in which case
    the proxy charges its fallback principal. There is deliberately no field for credentials.
    """

    mechanism: str
    user: str | None


class SaslOutcome(enum.Enum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class _Step(enum.Enum):
    """Where an exchange is; names the next message expected."""

    CLIENT_FIRST = "client-first"
    SERVER_FIRST = "server-first"  # SCRAM only
    CLIENT_FINAL = "client-final"  # SCRAM only
    SERVER_FINAL = "server-final"
    OPAQUE = "opaque"  # GSSAPI / unknown: tokens we cannot follow


@dataclass(slots=True)
class _Exchange:
    """One SASL exchange (a handshake and the tokens after it). Holds no token bytes."""

    mechanism: str
    raw: bool  # tokens framed without Kafka headers (SaslHandshake v0)
    accepted: bool = False  # the broker's handshake response said error 0
    step: _Step = _Step.CLIENT_FIRST
    user: str | None = None
    authzid_mismatch: bool = False
    client_tokens: int = 0

    @property
    def readable(self) -> bool:
        return self.mechanism in (mech.PLAIN, mech.OAUTHBEARER) or (
            self.mechanism in mech.SCRAM_MECHANISMS
        )


class SaslObserver:
    """One per client connection. Feed it the SASL-related traffic in order; it tells the proxy
    how to frame the next bytes and, on success, which user the broker accepted.

    Handshake/authenticate bodies are what follows the request/response header. Bodies that are
    not valid Kafka messages raise ``MalformedMessageError`` (or ``UnsupportedApiError`` for a
    version outside the ranges above) after failing the exchange in progress; SASL tokens never
    raise: an unreadable one just means no user (``SaslClaim.user is None``).
    """

    __slots__ = (
        "_authenticated",
        "_authzid_mismatch",
        "_claim_name",
        "_exchange",
        "_kvsep_pending",
        "_last_error_code",
        "_session_lifetime_ms",
    )

    def __init__(self, oauth_principal_claim: str = "sub") -> None:
        self._claim_name = oauth_principal_claim
        self._exchange: _Exchange | None = None
        self._authenticated: SaslClaim | None = None
        self._session_lifetime_ms: int | None = None
        self._last_error_code: int | None = None
        self._authzid_mismatch = False
        # After an OAUTHBEARER error JSON under a v0 handshake the exchange has failed, but the
        # client still sends one bare kvsep token (RFC 7628 section 3.2.3) before the broker
        # closes: it must not be read as a Kafka request.
        self._kvsep_pending = False

    def __repr__(self) -> str:
        ex = self._exchange
        current = "none" if ex is None else f"{ex.mechanism}:{ex.step.value}"
        return (
            f"SaslObserver(authenticated={self._authenticated!r}, exchange={current}, "
            f"raw={self.expects_raw_tokens}, session_lifetime_ms={self._session_lifetime_ms})"
        )

    # -- what the proxy reads ---------------------------------------------------------------------

    @property
    def authenticated(self) -> SaslClaim | None:
        """The claim of the last exchange the broker said SUCCEEDED. It stays set during a
        KIP-368 re-authentication until the new exchange succeeds; a failed re-authentication
        leaves it (the broker closes the connection anyway)."""
        return self._authenticated

    @property
    def session_lifetime_ms(self) -> int | None:
        """session_lifetime_ms of the successful SaslAuthenticate v1+ response (0: the broker
        set no lifetime); None after a v0 handshake or a SaslAuthenticate v0 success."""
        return self._session_lifetime_ms

    @property
    def in_progress(self) -> bool:
        """A handshake was sent and its exchange has not yet succeeded or failed."""
        return self._exchange is not None

    @property
    def expects_raw_tokens(self) -> bool:
        """After a successful SaslHandshake v0 the next client frames are bare size-prefixed
        tokens (no Kafka header), and so are the broker's replies, until the exchange ends."""
        ex = self._exchange
        return self._kvsep_pending or (ex is not None and ex.raw and ex.accepted)

    @property
    def authzid_mismatch(self) -> bool:
        """The latest client initial message asked for an authorization id different from its
        authentication id. Kafka's brokers reject that; pidgate never uses the authzid."""
        return self._authzid_mismatch

    @property
    def last_error_code(self) -> int | None:
        """error_code of the latest SaslHandshake/SaslAuthenticate response (for logs)."""
        return self._last_error_code

    # -- SaslHandshake (KIP-43 v0, KIP-152 v1) ----------------------------------------------------

    def on_handshake_request(self, body: bytes | memoryview, api_version: int) -> None:
        """A new handshake starts a new exchange, also on an authenticated connection (KIP-368
        re-authentication); ``authenticated`` is untouched until that exchange succeeds."""
        self._exchange = None
        self._kvsep_pending = False
        _check_version(SASL_HANDSHAKE, api_version, SASL_HANDSHAKE_VERSIONS)
        buf = as_memoryview(body)
        try:
            mechanism, _ = read_nullable_string(buf, 0, "SaslHandshake mechanism")
        except (struct.error, IndexError) as exc:
            raise MalformedMessageError(f"malformed SaslHandshake request: {exc}") from None
        self._authzid_mismatch = False
        self._exchange = _Exchange(mechanism=mechanism or "", raw=api_version == 0)

    def on_handshake_response(self, body: bytes | memoryview, api_version: int) -> None:
        _check_version(SASL_HANDSHAKE, api_version, SASL_HANDSHAKE_VERSIONS)
        buf = as_memoryview(body)
        try:
            need(buf, 0, 2, "SaslHandshake response error_code")
            error_code = int(I16.unpack_from(buf, 0)[0])
        except MalformedMessageError:
            self._exchange = None
            raise
        self._last_error_code = error_code
        ex = self._exchange
        if ex is None:
            return
        if error_code != 0:  # e.g. 33 UNSUPPORTED_SASL_MECHANISM: no exchange follows
            self._exchange = None
            return
        ex.accepted = True

    # -- SaslHandshake v0: bare tokens ------------------------------------------------------------

    def raw_client_frame_is_request(self, payload: bytes | memoryview) -> bool:
        """Call on each client frame (without its size prefix) while ``expects_raw_tokens``,
        before ``on_raw_client_token``. True means the frame is a Kafka request, not a token:
        the raw exchange is over; frame it as a request and do not pass it as a token.

        Only possible for mechanisms whose end pidgate cannot read (GSSAPI, unknown ones): under
        a v0 handshake the broker sends nothing after GSSAPI's last client token, so the client's
        next request is the only sign. The exchange then counts as SUCCEEDED with user None
        (had the broker not completed it, it would fail on the "token" and close). A GSSAPI token
        (0x60 ASN.1 tag, or an RFC 4121 0x0504 wrap token) never parses as a known request header.
        """
        ex = self._exchange
        if not self.expects_raw_tokens or self._kvsep_pending or ex is None or ex.readable:
            return False
        if ex.client_tokens == 0:
            return False
        try:
            hdr = parse_request_header(payload)
        except (MalformedMessageError, UnsupportedApiError):
            return False
        if hdr.api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE) or hdr.correlation_id < 0:
            return False
        self._succeed(ex, lifetime_ms=None)
        return True

    def on_raw_client_token(self, token: bytes | memoryview) -> None:
        """A bare client token (payload without the 4-byte size) after a v0 handshake."""
        if self._kvsep_pending:
            self._kvsep_pending = False  # the dummy kvsep; the broker now closes
            return
        ex = self._exchange
        if ex is None or not ex.raw or not ex.accepted:
            return
        self._client_token(ex, as_memoryview(token))

    def on_raw_server_token(self, token: bytes | memoryview) -> SaslOutcome:
        """A bare broker token after a v0 handshake. A v0 failure is usually the broker closing
        the connection (the proxy sees that itself), sometimes a SCRAM ``e=`` server-final."""
        ex = self._exchange
        if ex is None or not ex.raw or not ex.accepted:
            return SaslOutcome.FAILED  # not in a raw exchange: nothing to conclude
        return self._server_token(ex, as_memoryview(token), lifetime_ms=None)

    # -- SaslAuthenticate (KIP-152), v0-v2 --------------------------------------------------------

    def on_authenticate_request(self, body: bytes | memoryview, api_version: int) -> None:
        _check_version(SASL_AUTHENTICATE, api_version, SASL_AUTHENTICATE_VERSIONS)
        buf = as_memoryview(body)
        flexible = api_version >= _FIRST_FLEXIBLE_AUTHENTICATE
        try:
            token, pos = _read_bytes(buf, 0, flexible, "SaslAuthenticate request auth_bytes")
            if flexible:
                skip_tagged_fields(buf, pos)
        except (MalformedMessageError, struct.error, IndexError) as exc:
            raise self._unreadable(exc, f"SaslAuthenticate v{api_version} request") from None
        ex = self._exchange
        if ex is None or ex.raw:
            # No v1 handshake before it: the broker answers ILLEGAL_SASL_STATE; nothing to learn.
            return
        # Not waiting for the handshake's answer: a client may pipeline its token behind the
        # handshake. Were the handshake refused, its answer (which comes first, responses are in
        # order) ends the exchange and this token with it; ignoring the token instead would let
        # a re-authenticating client keep being charged to its previous principal.
        self._client_token(ex, token)

    def on_authenticate_response(self, body: bytes | memoryview, api_version: int) -> SaslOutcome:
        """The broker's verdict on the latest client token. error_code 0 on the *final* step
        is success; for SCRAM the first error-0 response only carries the server-first-message.
        """
        _check_version(SASL_AUTHENTICATE, api_version, SASL_AUTHENTICATE_VERSIONS)
        buf = as_memoryview(body)
        flexible = api_version >= _FIRST_FLEXIBLE_AUTHENTICATE
        try:
            need(buf, 0, 2, "SaslAuthenticate response error_code")
            error_code = int(I16.unpack_from(buf, 0)[0])
            # error_message: skipped, not decoded (we neither need nor keep it).
            pos = _skip_nullable_string(buf, 2, flexible)
            token, pos = _read_bytes(buf, pos, flexible, "SaslAuthenticate response auth_bytes")
            lifetime_ms: int | None = None
            if api_version >= 1:
                need(buf, pos, 8, "SaslAuthenticate response session_lifetime_ms")
                lifetime_ms = int(I64.unpack_from(buf, pos)[0])
                pos += 8
            if flexible:
                skip_tagged_fields(buf, pos)
        except (MalformedMessageError, struct.error, IndexError) as exc:
            raise self._unreadable(exc, f"SaslAuthenticate v{api_version} response") from None
        self._last_error_code = error_code
        ex = self._exchange
        if ex is None or ex.raw or not ex.accepted:
            return SaslOutcome.FAILED  # an answer to a request outside any v1 exchange
        if error_code != 0:
            self._exchange = None
            return SaslOutcome.FAILED
        return self._server_token(ex, token, lifetime_ms=lifetime_ms)

    # -- the exchange, whatever the framing --------------------------------------------------------

    def _client_token(self, ex: _Exchange, token: memoryview) -> None:
        ex.client_tokens += 1
        if ex.mechanism in mech.SCRAM_MECHANISMS:
            # RFC 5802: a client-first-message (re)starts the exchange; the name that counts is
            # the one of the exchange in progress when the broker's success arrives.
            if mech.looks_like_scram_client_first(token):
                self._initial(ex, mech.read_scram_client_first(token))
                ex.step = _Step.SERVER_FIRST
            elif ex.step is _Step.CLIENT_FINAL:
                ex.step = _Step.SERVER_FINAL
            else:
                ex.step = _Step.OPAQUE  # out of order: no success can be read from here
                ex.user = None
        elif ex.mechanism == mech.PLAIN:
            if ex.step is _Step.CLIENT_FIRST:
                self._initial(ex, mech.read_plain(token))
                ex.step = _Step.SERVER_FINAL
            else:
                ex.step = _Step.OPAQUE
                ex.user = None
        elif ex.mechanism == mech.OAUTHBEARER:
            if ex.step is _Step.CLIENT_FIRST:
                self._initial(ex, mech.read_oauthbearer(token, self._claim_name))
                ex.step = _Step.SERVER_FINAL
            else:
                ex.step = _Step.OPAQUE
                ex.user = None
        else:
            ex.step = _Step.OPAQUE  # GSSAPI / unknown: user stays None

    def _initial(self, ex: _Exchange, claimed: mech.ClaimedIdentity) -> None:
        ex.user = claimed.user
        ex.authzid_mismatch = claimed.authzid_mismatch
        self._authzid_mismatch = claimed.authzid_mismatch

    def _server_token(
        self, ex: _Exchange, token: memoryview, lifetime_ms: int | None
    ) -> SaslOutcome:
        """Interpret a broker token the broker itself did not flag as an error."""
        if not ex.readable:
            # GSSAPI / unknown: we cannot follow the tokens. Kafka answers the final step with
            # empty auth_bytes (SaslServerAuthenticator sends an empty token when the mechanism
            # has nothing more to say), and only the final answer carries a session lifetime.
            # Under v0 the end is found by raw_client_frame_is_request instead. Either way the
            # user is None, so a wrong guess only moves *when* the fallback principal applies.
            if not ex.raw and ex.client_tokens > 0 and (len(token) == 0 or (lifetime_ms or 0) > 0):
                return self._succeed(ex, lifetime_ms)
            return SaslOutcome.PENDING
        if ex.mechanism in mech.SCRAM_MECHANISMS:
            head = bytes(token[:2])
            if ex.step is _Step.SERVER_FIRST and head == b"r=":
                ex.step = _Step.CLIENT_FINAL
                return SaslOutcome.PENDING
            if ex.step is _Step.SERVER_FINAL and head == b"v=":
                return self._succeed(ex, lifetime_ms)
            return self._fail()  # "e=..." (RFC 5802 section 7) or out of order
        if ex.step is not _Step.SERVER_FINAL:
            return self._fail()  # a broker token before the client's
        if ex.mechanism == mech.OAUTHBEARER:
            if mech.oauthbearer_server_error(token):
                # RFC 7628 section 3.2.2: the error JSON. The client answers with a kvsep and
                # Kafka then fails the exchange (v1: error 58, v0: closes); it has failed now.
                # Under v1 the kvsep and its error response arrive outside any exchange and
                # change nothing; under v0 the kvsep comes bare and must not be framed as a
                # request.
                self._fail()
                self._kvsep_pending = ex.raw
                return SaslOutcome.FAILED
            return self._succeed(ex, lifetime_ms)
        # PLAIN: Kafka's PlainSaslServer answers success with an empty token.
        if len(token) == 0:
            return self._succeed(ex, lifetime_ms)
        return self._fail()

    def _succeed(self, ex: _Exchange, lifetime_ms: int | None) -> SaslOutcome:
        self._authenticated = SaslClaim(ex.mechanism, ex.user)
        self._session_lifetime_ms = lifetime_ms
        self._exchange = None
        return SaslOutcome.SUCCEEDED

    def _fail(self) -> SaslOutcome:
        self._exchange = None
        return SaslOutcome.FAILED

    def _unreadable(self, exc: Exception, what: str) -> MalformedMessageError:
        """Give up the exchange on an unreadable ``what``: returns the error to raise (``exc``
        itself when it already says what is wrong)."""
        self._exchange = None
        if isinstance(exc, MalformedMessageError):
            return exc
        return MalformedMessageError(f"malformed {what}")


def _check_version(api_key: int, api_version: int, supported: tuple[int, int]) -> None:
    if not supported[0] <= api_version <= supported[1]:
        raise UnsupportedApiError(
            f"api key {api_key} version {api_version} outside supported "
            f"{supported[0]}..{supported[1]}",
            api_key=api_key,
            api_version=api_version,
        )


def _read_length(
    buf: memoryview, pos: int, compact: bool, fixed: struct.Struct, what: str
) -> tuple[int, int]:
    """A length prefix: uvarint length + 1 when ``compact`` (flexible versions), else
    ``fixed`` (int32 for bytes, int16 for strings); -1 is null."""
    if compact:
        n, pos = read_uvarint(buf, pos)
        return n - 1, pos
    need(buf, pos, fixed.size, what)
    return int(fixed.unpack_from(buf, pos)[0]), pos + fixed.size


def _read_bytes(buf: memoryview, pos: int, compact: bool, what: str) -> tuple[memoryview, int]:
    """Kafka ``bytes``: int32 length, or uvarint length + 1 when flexible. Non-nullable here."""
    n, pos = _read_length(buf, pos, compact, I32, what)
    if n < 0:
        raise MalformedMessageError(f"invalid length {n} for {what}")
    need(buf, pos, n, what)
    return buf[pos : pos + n], pos + n


def _skip_nullable_string(buf: memoryview, pos: int, compact: bool) -> int:
    what = "SaslAuthenticate response error_message"
    n, pos = _read_length(buf, pos, compact, I16, what)
    if n < -1:
        raise MalformedMessageError(f"invalid length {n} for {what}")
    if n > 0:
        need(buf, pos, n, what)
        pos += n
    return pos
