"""Kafka's ``ssl.principal.mapping.rules`` (KIP-371) and the certificate-subject DN they read.

Owns two pure functions of strings:

* :class:`PrincipalMapper` parses a rules list such as
  ``RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L,DEFAULT`` and maps a distinguished name to a
  principal name, behaving like Apache Kafka's
  ``org.apache.kafka.common.security.ssl.SslPrincipalMapper`` (KIP-371,
  https://cwiki.apache.org/confluence/display/KAFKA/KIP-371%3A+Add+a+configuration+to+build+custom+SSL+principal+name):
  the same rule-splitting and rule-parsing grammar (commas inside rules, ``\\/`` escapes,
  surrounding whitespace and empty rules ignored), rules tried in order, first full
  match wins, ``DEFAULT`` returns the DN unchanged, no match is an error. A matching
  rule rewrites the DN the way Java's ``String.replaceAll`` does (every ``find()`` match
  replaced, ``$n`` / ``${name}`` / ``\\x`` in the replacement), after Kafka's own
  rewriting of ``$n`` references to groups that do not exist into literal text.
* :func:`distinguished_name` turns ``ssl.SSLSocket.getpeercert()["subject"]`` into the
  RFC 2253 string Java's ``X500Principal.getName()`` returns, which is what Kafka feeds
  to the rules.

Must not import: asyncio, socket, logging, structlog, prometheus_client,
``pidgate.proxy`` -- nothing but ``re`` and ``dataclasses``.

Known differences from Kafka on the JVM (everything else is meant to be identical):

* Rule patterns are Java regular expressions run by Python's ``re``. The module
  translates what differs in syntax -- ``(?<name>...)``, ``\\k<name>``,
  ``\\Q...\\E``, ``\\z``, ``\\Z`` -- and compiles with ``re.ASCII`` so ``\\w \\d \\s \\b``
  and ``(?i)`` are ASCII-only as in Java. Java-only constructs (``\\p{...}``, ``\\h``,
  ``\\R``, ``(?U)``, ``(?u)``, ``(?d)``, nested classes ``[a[b]]``, intersections
  ``[a&&b]``) are rejected when the rules are parsed rather than half-supported. Left
  as Python: ``.`` excludes only ``\\n`` (Java also excludes ``\\r``, U+0085, U+2028,
  U+2029), ``$`` only allows a final ``\\n`` before the end (Java any line terminator),
  ``\\v`` is only U+000B (Java: any vertical whitespace); and Python accepts a few
  things Java rejects (e.g. ``_`` in group names). DNs rarely contain line breaks.
* A rule whose replacement is unusable (``$`` at the end, ``$x``, ``$9`` with fewer
  groups, ``${unknown}``, trailing ``\\``) fails when it matches, as in Kafka, but with
  :class:`PrincipalMappingError` instead of Java's ``IllegalArgumentException`` /
  ``IndexOutOfBoundsException``.
* ``L``/``U`` use ``str.lower()``/``str.upper()``; Java's ``Locale.ENGLISH`` mappings
  agree on everything but a few rare special cases.
* :func:`distinguished_name` cannot see the ASN.1 string type of an attribute, which
  Java needs for attributes that have no RFC 2253 keyword (everything except CN, C, L,
  ST, O, OU, STREET, DC, UID): Java prints those as ``OID=#<hex of the DER value>``.
  The DER is rebuilt assuming the type the standards require -- IA5String for
  emailAddress, PrintableString for serialNumber / dnQualifier /
  jurisdictionCountryName, UTF8String otherwise -- so a certificate that used another
  type (e.g. a PrintableString title) produces different hex. Java also prints
  UniversalString values as hex, which the Python structure cannot reveal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "DefaultRule",
    "PrincipalMapper",
    "PrincipalMappingError",
    "RegexRule",
    "Rule",
    "distinguished_name",
]


class PrincipalMappingError(ValueError):
    """Invalid rules (Kafka: ``IllegalArgumentException``), or a DN no rule maps
    (Kafka: ``SslPrincipalMapper.NoMatchingRule``)."""


# --------------------------------------------------------------------------- rule grammar

# Java's `.`: anything but a line terminator.
_JAVA_DOT = r"[^\n\r\u0085\u2028\u2029]"
# Java's `$` without MULTILINE: end of input, or before one final line terminator.
_JAVA_END = r"(?=\r\n\Z|(?<!\r)\n\Z|[\r\u0085\u2028\u2029]\Z|\Z)"
# Kafka's RULE_PATTERN, group for group (inner repetitions made non-capturing).
_RULE = (
    r"(?P<default>DEFAULT)"
    rf"|RULE:(?P<pattern>(?:\\{_JAVA_DOT}|[^\\/])*)"
    rf"/(?P<replacement>(?:\\{_JAVA_DOT}|[^\\/])*)"
    rf"/(?P<case>[LU]?){_JAVA_DOT}*?"
    rf"|(?P<other>{_JAVA_DOT}*?)"
)
_RULE_SPLITTER = re.compile(rf"\s*(?P<rule>{_RULE})\s*(?:,\s*|{_JAVA_END})", re.ASCII)
_RULE_PARSER = re.compile(_RULE, re.ASCII)
_BACK_REFERENCE = re.compile(r"\$([0-9]+)")
_JAVA_INT_MAX = 2**31 - 1
_DEFAULT_RULES = "DEFAULT"  # Kafka's DEFAULT_SSL_PRINCIPAL_MAPPING_RULES


def _java_trim(text: str) -> str:
    """``String.trim()``: strips every char <= U+0020 (controls too), nothing else."""
    start, end = 0, len(text)
    while start < end and text[start] <= " ":
        start += 1
    while end > start and text[end - 1] <= " ":
        end -= 1
    return text[start:end]


def _java_find_all(regex: re.Pattern[str], text: str) -> list[re.Match[str]]:
    """Every match ``Matcher.find()`` reports, in order: the next search starts where the
    previous match ended, one further on after an empty match."""
    matches: list[re.Match[str]] = []
    first, last = -1, 0
    while True:
        start = last + 1 if last == first else last
        if start > len(text):
            return matches
        match = regex.search(text, start)
        if match is None:
            return matches
        matches.append(match)
        first, last = match.start(), match.end()


def _translate_java_regex(pattern: str) -> str:
    """Rewrite the Java-only spellings Python's ``re`` lacks; reject Java-only semantics."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    class_body = -1  # index where the current class's members start (a `]` there is literal)
    while i < n:
        char = pattern[i]
        if char == "\\" and i + 1 < n:
            escaped = pattern[i + 1]
            if escaped == "Q":
                end = pattern.find("\\E", i + 2)
                literal = pattern[i + 2 :] if end < 0 else pattern[i + 2 : end]
                out.append("".join(c if c.isalnum() else "\\" + c for c in literal))
                i = n if end < 0 else end + 2
                continue
            if not in_class and escaped == "z":
                out.append(r"\Z")
            elif not in_class and escaped == "Z":
                out.append(_JAVA_END)
            elif not in_class and escaped == "k" and pattern.startswith("<", i + 2):
                close = pattern.find(">", i + 3)
                if close < 0:
                    raise PrincipalMappingError(f"unterminated \\k<name> in `{pattern}`")
                out.append(f"(?P={pattern[i + 3 : close]})")
                i = close + 1
                continue
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if char == "[" or pattern.startswith("&&", i):
                raise PrincipalMappingError(
                    f"nested character classes and `&&` intersections are Java-only and not"
                    f" supported: `{pattern}`"
                )
            if char == "]" and i != class_body:
                in_class = False
            out.append(char)
            i += 1
            continue
        if char == "[":
            in_class = True
            out.append(char)
            i += 1
            if pattern.startswith("^", i):
                out.append("^")
                i += 1
            class_body = i
            continue
        if pattern.startswith("(?<", i) and not pattern.startswith(("(?<=", "(?<!"), i):
            out.append("(?P<")
            i += 3
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _compile_java_regex(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(_translate_java_regex(pattern), re.ASCII)
    except re.error as exc:
        raise PrincipalMappingError(f"Invalid rule pattern `{pattern}`: {exc}") from exc


def _escape_literal_back_references(replacement: str, group_count: int) -> str:
    """Kafka's ``escapeLiteralBackReferences`` (taken from Apache NiFi): a ``$n`` whose
    leading digit names no group becomes a literal ``\\$n``; ``$123`` with 12 groups
    stays a reference to group 12 followed by ``3``.

    Faithful to one quirk: Kafka scans the original string but inserts into the
    already-escaped copy using the original offsets, so after the first insertion later
    backslashes land one character early (``$4$5`` with 3 groups -> ``\\$\\4$5``)."""
    if group_count == 0:
        return replacement
    value = replacement
    for reference in _BACK_REFERENCE.finditer(replacement):
        digits = reference.group(1)
        if digits.startswith("0"):
            continue
        index = int(digits)
        if index > _JAVA_INT_MAX:  # Integer.parseInt's NumberFormatException
            raise PrincipalMappingError(f'Invalid group reference in replacement: "{digits}"')
        while index > group_count and index >= 10:
            index //= 10
        if index > group_count:
            at = reference.start(1) - 1
            value = value[:at] + "\\" + value[at:]
    return value


def _expand_replacement(replacement: str, match: re.Match[str]) -> str:
    """``Matcher.appendReplacement``'s expansion of ``\\x``, ``$n`` and ``${name}``."""
    regex = match.re
    out: list[str] = []
    cursor, n = 0, len(replacement)
    while cursor < n:
        char = replacement[cursor]
        if char == "\\":
            cursor += 1
            if cursor == n:
                raise PrincipalMappingError(
                    f"Invalid replacement `{replacement}`: character to be escaped is missing"
                )
            out.append(replacement[cursor])
            cursor += 1
            continue
        if char != "$":
            out.append(char)
            cursor += 1
            continue
        cursor += 1
        if cursor == n:
            raise PrincipalMappingError(
                f"Invalid replacement `{replacement}`: illegal group reference:"
                " group index is missing"
            )
        char = replacement[cursor]
        if char == "{":
            cursor += 1
            start = cursor
            while cursor < n and replacement[cursor].isascii() and replacement[cursor].isalnum():
                cursor += 1
            name = replacement[start:cursor]
            if not name:
                raise PrincipalMappingError(
                    f"Invalid replacement `{replacement}`: named capturing group has 0 length name"
                )
            if cursor == n or replacement[cursor] != "}":
                raise PrincipalMappingError(
                    f"Invalid replacement `{replacement}`: named capturing group is missing"
                    " trailing '}'"
                )
            if name[0].isdigit():
                raise PrincipalMappingError(
                    f"Invalid replacement `{replacement}`: capturing group name {{{name}}}"
                    " starts with digit character"
                )
            if name not in regex.groupindex:
                raise PrincipalMappingError(
                    f"Invalid replacement `{replacement}`: no group with name {{{name}}}"
                )
            group = regex.groupindex[name]
            cursor += 1
        else:
            if not "0" <= char <= "9":
                raise PrincipalMappingError(
                    f"Invalid replacement `{replacement}`: illegal group reference"
                )
            group = int(char)
            cursor += 1
            # The first digit is always a group; further digits only while one exists.
            while cursor < n and "0" <= replacement[cursor] <= "9":
                longer = group * 10 + int(replacement[cursor])
                if longer > regex.groups:
                    break
                group = longer
                cursor += 1
            if group > regex.groups:
                raise PrincipalMappingError(
                    f"Invalid replacement `{replacement}`: no group {group}"
                    f" (the pattern has {regex.groups})"
                )
        captured = match.group(group)
        if captured is not None:
            out.append(captured)
    return "".join(out)


def _java_replace_all(regex: re.Pattern[str], text: str, replacement: str) -> str:
    """``text.replaceAll(regex, replacement)`` with Java's find and expansion rules."""
    out: list[str] = []
    tail = 0
    for match in _java_find_all(regex, text):
        out.append(text[tail : match.start()])
        out.append(_expand_replacement(replacement, match))
        tail = match.end()
    out.append(text[tail:])
    return "".join(out)


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class DefaultRule:
    """``DEFAULT``: the distinguished name itself is the principal."""

    def apply(self, distinguished_name: str) -> str | None:
        return distinguished_name

    def __str__(self) -> str:
        return "DEFAULT"


@dataclass(frozen=True)
class RegexRule:
    """``RULE:pattern/replacement/[L|U]``: applies when ``pattern`` matches the whole DN."""

    pattern: str
    replacement: str
    to_lower_case: bool = False
    to_upper_case: bool = False
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", _compile_java_regex(self.pattern))

    def apply(self, distinguished_name: str) -> str | None:
        """The mapped name, or None when the pattern does not match the whole DN."""
        if self._regex.fullmatch(distinguished_name) is None:
            return None
        replacement = _escape_literal_back_references(self.replacement, self._regex.groups)
        result = _java_replace_all(self._regex, distinguished_name, replacement)
        if self.to_lower_case:
            return result.lower()
        if self.to_upper_case:
            return result.upper()
        return result

    def __str__(self) -> str:
        case = "/L" if self.to_lower_case else "/U" if self.to_upper_case else ""
        return f"RULE:{self.pattern}/{self.replacement}{case}"


Rule = DefaultRule | RegexRule


def _split_rules(rules: str) -> list[str]:
    return [match.group("rule") for match in _java_find_all(_RULE_SPLITTER, _java_trim(rules))]


def _parse_rule(rule: str) -> Rule | None:
    match = _RULE_PARSER.match(rule)  # lookingAt(); the last alternative always matches
    if match is None:
        raise PrincipalMappingError(f"Invalid rule: {rule}")
    if match.end() != len(rule):
        raise PrincipalMappingError(
            f"Invalid rule: `{rule}`, unmatched substring: `{rule[match.end() :]}`"
        )
    if match.group("default") is not None:
        return DefaultRule()
    if match.group("pattern") is not None:
        case = match.group("case")
        return RegexRule(
            match.group("pattern"),
            match.group("replacement"),
            to_lower_case=case == "L",
            to_upper_case=case == "U",
        )
    return None  # empty rules are ignored


@dataclass(frozen=True)
class PrincipalMapper:
    """An ordered ``ssl.principal.mapping.rules`` list; the first rule that applies wins."""

    rules: tuple[Rule, ...]

    @classmethod
    def parse(cls, rules: str) -> PrincipalMapper:
        """Parse a rules list; raise :class:`PrincipalMappingError` naming a bad rule.

        An empty list parses (to no rules, so every :meth:`map` fails), as in Kafka."""
        parsed = (_parse_rule(rule) for rule in _split_rules(rules))
        return cls(tuple(rule for rule in parsed if rule is not None))

    @classmethod
    def default(cls) -> PrincipalMapper:
        """Kafka's default, ``DEFAULT``: the DN is the principal name."""
        return cls.parse(_DEFAULT_RULES)

    def map(self, distinguished_name: str) -> str:
        """The principal for ``distinguished_name``; raise PrincipalMappingError if no rule
        applies (or the applying rule's replacement is unusable)."""
        for rule in self.rules:
            name = rule.apply(distinguished_name)
            if name is not None:
                return name
        raise PrincipalMappingError(f"No rules apply to {distinguished_name}, rules {self._list()}")

    def _list(self) -> str:
        return "[" + ", ".join(str(rule) for rule in self.rules) + "]"

    def __str__(self) -> str:
        return f"PrincipalMapper(rules = {self._list()})"


# --------------------------------------------------------------------------- subject DN

Subject = tuple[tuple[tuple[str, str], ...], ...]

# Attributes with an RFC 2253 keyword in Java (sun.security.x509.AVAKeyword), keyed by
# the OpenSSL long name Python's getpeercert() reports, its short name and its OID.
_KEYWORDS = {
    name: keyword
    for keyword, names in {
        "CN": ("commonName", "CN", "2.5.4.3"),
        "C": ("countryName", "C", "2.5.4.6"),
        "L": ("localityName", "L", "2.5.4.7"),
        "ST": ("stateOrProvinceName", "ST", "2.5.4.8"),
        "O": ("organizationName", "O", "2.5.4.10"),
        "OU": ("organizationalUnitName", "OU", "2.5.4.11"),
        "STREET": ("streetAddress", "street", "2.5.4.9"),
        "DC": ("domainComponent", "DC", "0.9.2342.19200300.100.1.25"),
        "UID": ("userId", "UID", "0.9.2342.19200300.100.1.1"),
    }.items()
    for name in names
}

_UTF8_STRING, _PRINTABLE_STRING, _IA5_STRING = 0x0C, 0x13, 0x16

# Everything else Java prints as OID=#hex-of-DER: the OID and the ASN.1 string type the
# standards prescribe (the Python structure does not carry the real one).
_OIDS: dict[str, tuple[str, int]] = {
    "emailAddress": ("1.2.840.113549.1.9.1", _IA5_STRING),
    "serialNumber": ("2.5.4.5", _PRINTABLE_STRING),
    "dnQualifier": ("2.5.4.46", _PRINTABLE_STRING),
    "jurisdictionCountryName": ("1.3.6.1.4.1.311.60.2.1.3", _PRINTABLE_STRING),
    "jurisdictionStateOrProvinceName": ("1.3.6.1.4.1.311.60.2.1.2", _UTF8_STRING),
    "jurisdictionLocalityName": ("1.3.6.1.4.1.311.60.2.1.1", _UTF8_STRING),
    "surname": ("2.5.4.4", _UTF8_STRING),
    "title": ("2.5.4.12", _UTF8_STRING),
    "description": ("2.5.4.13", _UTF8_STRING),
    "businessCategory": ("2.5.4.15", _UTF8_STRING),
    "postalCode": ("2.5.4.17", _UTF8_STRING),
    "name": ("2.5.4.41", _UTF8_STRING),
    "givenName": ("2.5.4.42", _UTF8_STRING),
    "initials": ("2.5.4.43", _UTF8_STRING),
    "generationQualifier": ("2.5.4.44", _UTF8_STRING),
    "pseudonym": ("2.5.4.65", _UTF8_STRING),
    "organizationIdentifier": ("2.5.4.97", _UTF8_STRING),
}
_OID_SYNTAX = re.compile(r"[0-9]+(?:\.[0-9]+)+")
# ASN.1 PrintableString's alphabet.
_PRINTABLE = re.compile(r"[A-Za-z0-9 '()+,\-./:=?]*")
# Java's RFC 2253 escapees: RFC 2253's `,+"\<>;` plus `=` and `#` anywhere.
_ESCAPEES = ',=+<>#;"\\'


def _der_hex(value: str, tag: int) -> str:
    if tag == _PRINTABLE_STRING and _PRINTABLE.fullmatch(value) is None:
        tag = _UTF8_STRING
    if tag == _IA5_STRING and not value.isascii():
        tag = _UTF8_STRING
    data = value.encode("utf-8")
    size = len(data)
    length = bytes([size]) if size < 0x80 else _long_form_length(size)
    return "#" + (bytes([tag]) + length + data).hex()


def _long_form_length(size: int) -> bytes:
    octets = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(octets)]) + octets


def _escape_value(value: str) -> str:
    """``AVA.toRFC2253String``'s string branch."""
    chars: list[str] = []
    for char in value:
        if char in _ESCAPEES:
            chars.append("\\" + char)
        elif char == "\0":
            chars.append("\\00")
        else:
            chars.append(char)
    escaped = "".join(chars)
    lead = 0
    while lead < len(escaped) and escaped[lead] in " \r":
        lead += 1
    trail = len(escaped) - 1
    while trail >= 0 and escaped[trail] in " \r":
        trail -= 1
    return "".join(
        "\\" + char if index < lead or index > trail else char for index, char in enumerate(escaped)
    )


def _attribute(name: str, value: str) -> str:
    keyword = _KEYWORDS.get(name)
    if keyword is not None:
        return f"{keyword}={_escape_value(value)}"
    if name in _OIDS:
        oid, tag = _OIDS[name]
    elif _OID_SYNTAX.fullmatch(name):
        oid, tag = name, _UTF8_STRING
    else:
        raise PrincipalMappingError(f"unknown certificate subject attribute type {name!r}")
    return f"{oid}={_der_hex(value, tag)}"


def distinguished_name(subject: Subject) -> str:
    """The RFC 2253 DN Java's ``X500Principal.getName()`` gives for a certificate subject.

    ``subject`` is ``ssl.SSLSocket.getpeercert()["subject"]``: relative distinguished
    names in certificate order (most general first), each a tuple of ``(type, value)``
    pairs. Java prints them most specific first, joined by ``,``; the attributes of a
    multi-valued RDN in their encoded order, joined by ``+``."""
    return ",".join(
        "+".join(_attribute(name, value) for name, value in rdn) for rdn in reversed(subject)
    )
