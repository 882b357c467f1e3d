"""ssl.principal.mapping.rules (KIP-371): Kafka's own SslPrincipalMapperTest cases, ported,
plus the Java replaceAll details and the certificate-subject -> RFC 2253 DN conversion.

Expected values were checked against Kafka's SslPrincipalMapper logic and
X500Principal.getName() on OpenJDK 17.
"""

from __future__ import annotations

import pytest

from pidgate.config.principal_mapping import (
    DefaultRule,
    PrincipalMapper,
    PrincipalMappingError,
    RegexRule,
    distinguished_name,
)

# --------------------------------------------------------------------------- SslPrincipalMapperTest


@pytest.mark.parametrize(
    "rules",
    [
        "DEFAULT",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
        "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
        "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
        "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
    ],
)
def test_valid_rules(rules: str) -> None:
    assert PrincipalMapper.parse(rules).rules


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ("default", "Invalid rule: `default`, unmatched substring: `default`"),
        ("DEFAUL", "Invalid rule: `DEFAUL`, unmatched substring: `DEFAUL`"),
        ("DEFAULT/L", "Invalid rule: `DEFAULT/L`, unmatched substring: `/L`"),
        ("DEFAULT/U", "Invalid rule: `DEFAULT/U`, unmatched substring: `/U`"),
        (
            "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
            "Invalid rule: `RULE:CN=(.*?)`, unmatched substring: `RULE:CN=(.*?)`",
        ),
        (
            "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
            "Invalid rule: `rule:^CN=(.*?)`, unmatched substring: `rule:^CN=(.*?)`",
        ),
        (
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
            "Invalid rule: `RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U`, unmatched substring: `/U`",
        ),
        (
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
            "Invalid rule: `RULE:^CN=(.*?)`, unmatched substring: `RULE:^CN=(.*?)`",
        ),
        (
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
            "Invalid rule: `RULE:^CN=(.*?)`, unmatched substring: `RULE:^CN=(.*?)`",
        ),
        (
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
            "Invalid rule: `RULE:^CN=(.*?)`, unmatched substring: `RULE:^CN=(.*?)`",
        ),
        ("RULE:a/b/ x, DEFAULT", "Invalid rule: `RULE:a/b/ x`, unmatched substring: ` x`"),
        ("RULE:a/b/Lx", "Invalid rule: `RULE:a/b/Lx`, unmatched substring: `x`"),
    ],
)
def test_invalid_rules_name_the_bad_rule(rules: str, message: str) -> None:
    with pytest.raises(PrincipalMappingError) as raised:
        PrincipalMapper.parse(rules)
    assert str(raised.value) == message


def test_principal_mapper() -> None:
    mapper = PrincipalMapper.parse(
        ", ".join(
            [
                "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
                "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
                "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
                "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
                "DEFAULT",
            ]
        )
    )
    assert mapper.map("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.map("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.map("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.map("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert (
        mapper.map("OU=JavaSoft,O=Sun Microsystems,C=US") == "OU=JavaSoft,O=Sun Microsystems,C=US"
    )


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ("", "[]"),
        ("DEFAULT", "[DEFAULT]"),
        ("RULE://", "[RULE:/]"),
        ("RULE:/.*/", "[RULE:/.*]"),
        ("RULE:/.*/L", "[RULE:/.*/L]"),
        ("RULE://,DEFAULT", "[RULE:/, DEFAULT]"),
        ("  RULE:// ,  DEFAULT  ", "[RULE:/, DEFAULT]"),
        ("  RULE:   /     / ,  DEFAULT  ", "[RULE:   /     , DEFAULT]"),
        ("  RULE:  /     /U   ,DEFAULT  ", "[RULE:  /     /U, DEFAULT]"),
        (
            "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ",
            "[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]",
        ),
        # empty rules are ignored
        (",   , , ,      , , ,   ", "[]"),
        (",,RULE://,,,DEFAULT,,", "[RULE:/, DEFAULT]"),
        (",  , RULE: /   /    ,,,   DEFAULT, ,   ", "[RULE: /   , DEFAULT]"),
        ("     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,", "[RULE:   /  /U, DEFAULT]"),
        # escape sequences
        (r"RULE:\/\\\(\)\n\t/\/\//", r"[RULE:\/\\\(\)\n\t/\/\/]"),
        (r"RULE:\**\/+/*/L,RULE:\/*\**/**/", r"[RULE:\**\/+/*/L, RULE:\/*\**/**]"),
        # rules rule
        (
            r"RULE:,RULE:,/,RULE:,\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,"
            r"RULE:, DEFAULT, /DEFAULT/,DEFAULT",
            r"[RULE:,RULE:,/,RULE:,\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, "
            r"RULE:, DEFAULT, /DEFAULT, DEFAULT]",
        ),
    ],
)
def test_rules_splitting(rules: str, expected: str) -> None:
    assert str(PrincipalMapper.parse(rules)) == f"PrincipalMapper(rules = {expected})"


def test_comma_with_whitespace() -> None:
    mapper = PrincipalMapper.parse(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.map(r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz") == r"Tkac\, Adam"


# --------------------------------------------------------------------------- the brief's example


BRIEF_RULES = (
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
    "DEFAULT"
)


def test_parsed_rules_are_typed_values() -> None:
    assert PrincipalMapper.parse(BRIEF_RULES).rules == (
        RegexRule("^CN=(.*?),OU=ServiceUsers.*$", "$1"),
        RegexRule("^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$", "$1@$2", True, False),
        DefaultRule(),
    )
    assert PrincipalMapper.default().rules == (DefaultRule(),)


@pytest.mark.parametrize(
    ("dn", "principal"),
    [
        ("CN=alice,OU=ServiceUsers,O=Acme,L=Paris,ST=IDF,C=FR", "alice"),
        ("CN=Bob,OU=Eng,O=Acme,L=Paris,ST=IDF,C=FR", "bob@eng"),
        ("CN=Carol,O=Acme", "CN=Carol,O=Acme"),
    ],
)
def test_first_matching_rule_wins(dn: str, principal: str) -> None:
    assert PrincipalMapper.parse(BRIEF_RULES).map(dn) == principal


def test_no_matching_rule_is_an_error_naming_dn_and_rules() -> None:
    mapper = PrincipalMapper.parse("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/U")
    with pytest.raises(PrincipalMappingError) as raised:
        mapper.map("CN=Bob,OU=Eng")
    assert str(raised.value) == (
        "No rules apply to CN=Bob,OU=Eng, rules [RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/U]"
    )
    with pytest.raises(PrincipalMappingError, match="No rules apply"):
        PrincipalMapper.parse("").map("CN=anyone")


def test_patterns_must_match_the_whole_dn() -> None:
    mapper = PrincipalMapper.parse("RULE:CN=(\\w+)/$1/")
    assert mapper.map("CN=alice") == "alice"
    with pytest.raises(PrincipalMappingError):
        mapper.map("CN=alice,O=Acme")


def test_lower_and_upper_case() -> None:
    assert PrincipalMapper.parse("RULE:^CN=(.*)$/$1/L").map("CN=MiXeD") == "mixed"
    assert PrincipalMapper.parse("RULE:^CN=(.*)$/$1/U").map("CN=MiXeD") == "MIXED"
    assert PrincipalMapper.parse("RULE:^CN=(.*)$/$1/").map("CN=MiXeD") == "MiXeD"
    assert PrincipalMapper.parse("RULE:^CN=(.*)$/$1/U").map("CN=Straße") == "STRASSE"


# --------------------------------------------------------------------------- Java replaceAll


@pytest.mark.parametrize(
    ("rules", "dn", "principal"),
    [
        # replaceAll replaces every find() match: `.*` also matches empty at the end
        ("RULE:(.*)/x/", "abc", "xx"),
        ("RULE:(.*?)/[$1]/", "ab", "[]a[]b[]"),
        ("RULE:x*/-/", "", "-"),
        # $0 is the whole match; so is $00, and $01 is group 1 (digits join while a group exists)
        ("RULE:^CN=(\\w+),(.*)$/$0|$00|$01|$03/", "CN=a,O=b", "CN=a,O=b|CN=a,O=b|a|CN=a,O=b3"),
        # Kafka makes a reference to a missing group literal ...
        ("RULE:^CN=(\\w+),(.*)$/$1@$4/", "CN=a,O=b", "a@$4"),
        # ... and Java keeps digits only while the group exists: $12 is $1 then "2"
        ("RULE:^CN=(\\w+),(.*)$/$12/", "CN=a,O=b", "a2"),
        ("RULE:^CN=(\\w+),(.*)$/$9$1/", "CN=a,O=b", "$9a"),
        # a group that did not take part is empty
        ("RULE:^(a)?(b)$/[$1]/", "b", "[]"),
        # backslash escapes in the replacement
        (r"RULE:^CN=(\w+).*$/\$1\\/", "CN=a", "$1\\"),
        # Java named groups and ${name}
        ("RULE:^CN=(?<user>\\w+).*$/${user}!/", "CN=alice,O=x", "alice!"),
        ("RULE:^CN=(?<user>\\w+),\\k<user>$/${user}/", "CN=bob,bob", "bob"),
        # \Q...\E quoting and \z
        ("RULE:^CN=\\Q.*\\E(.*)$/$1/", "CN=.*xyz", "xyz"),
        ("RULE:^CN=([^,]+).*\\z/$1/", "CN=alice,O=x", "alice"),
        # Java's \w is ASCII-only, so is (?i)
        ("RULE:^CN=(\\w+).*$/$1/", "CN=Straße", "Stra"),
        ("RULE:(?i)^cn=(\\w+)$/$1/U", "CN=duke", "DUKE"),
    ],
)
def test_java_replace_all_semantics(rules: str, dn: str, principal: str) -> None:
    assert PrincipalMapper.parse(rules).map(dn) == principal


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ("RULE:CN=.*/$1/", "no group 1"),
        ("RULE:^CN=(\\w+),(.*)$/$4$5/", "no group 5"),  # Kafka's off-by-one escaping
        ("RULE:^CN=(\\w+).*$/$x/", "illegal group reference"),
        ("RULE:^CN=(\\w+).*$/a$/", "group index is missing"),
        ("RULE:^CN=(?<user>\\w+).*$/${nope}/", "no group with name {nope}"),
        ("RULE:^CN=(\\w+).*$/$10000000000/", "Invalid group reference"),
    ],
)
def test_unusable_replacements_fail_when_the_rule_matches(rules: str, message: str) -> None:
    mapper = PrincipalMapper.parse(rules + ",DEFAULT")
    assert mapper.map("O=elsewhere") == "O=elsewhere"  # as in Kafka: only a match fails
    with pytest.raises(PrincipalMappingError, match=message):
        mapper.map("CN=a,O=b")


@pytest.mark.parametrize(
    "rules",
    [
        "RULE:(/x/",
        "RULE:[a-z&&[^e]]+/x/",
        "RULE:[a[b]]/x/",
        "RULE:\\p{Lower}+/x/",
        "RULE:(?U)\\w/x/",
    ],
)
def test_bad_or_java_only_patterns_are_rejected_when_parsed(rules: str) -> None:
    with pytest.raises(PrincipalMappingError, match="`"):
        PrincipalMapper.parse(rules)


# --------------------------------------------------------------------------- subject -> DN


def test_distinguished_name_is_most_specific_first() -> None:
    subject = (
        (("countryName", "FR"),),
        (("stateOrProvinceName", "IDF"),),
        (("localityName", "Paris"),),
        (("organizationName", "Acme"),),
        (("organizationalUnitName", "ServiceUsers"),),
        (("commonName", "alice"),),
    )
    dn = distinguished_name(subject)
    assert dn == "CN=alice,OU=ServiceUsers,O=Acme,L=Paris,ST=IDF,C=FR"
    assert PrincipalMapper.parse(BRIEF_RULES).map(dn) == "alice"


def test_distinguished_name_matches_java_for_a_real_certificate() -> None:
    # getpeercert()["subject"] of an OpenSSL-made certificate, and what Java 17's
    # X500Principal.getName() printed for the same certificate.
    subject = (
        (("countryName", "FR"),),
        (("stateOrProvinceName", "IDF"),),
        (("localityName", "Paris"),),
        (("organizationName", "Acme"),),
        (("organizationalUnitName", "ServiceUsers"),),
        (("streetAddress", "1 rue"),),
        (("domainComponent", "example"),),
        (("userId", "u1"),),
        (("serialNumber", "42"),),
        (("emailAddress", "a@b.c"),),
        (("title", "Dr"), ("commonName", "alice, jr")),
    )
    assert distinguished_name(subject) == (
        "2.5.4.12=#0c024472+CN=alice\\, jr,1.2.840.113549.1.9.1=#16056140622e63,"
        "2.5.4.5=#13023432,UID=u1,DC=example,STREET=1 rue,OU=ServiceUsers,O=Acme,"
        "L=Paris,ST=IDF,C=FR"
    )


@pytest.mark.parametrize(
    ("subject", "dn"),
    [
        # Java escapes , = + < > # ; " \ anywhere, and leading/trailing spaces
        (((("organizationName", 'a=b#c;d<e>f"g\\h'),),), 'O=a\\=b\\#c\\;d\\<e\\>f\\"g\\\\h'),
        (((("commonName", "a+b"),),), "CN=a\\+b"),
        (((("commonName", "#hash"),),), "CN=\\#hash"),
        (((("organizationalUnitName", " lead and trail  "),),), "OU=\\ lead and trail\\ \\ "),
        (((("commonName", "nul\0"),),), "CN=nul\\00"),
        # non-ASCII is kept as is
        (((("localityName", "Zoë 日本"),),), "L=Zoë 日本"),
        # attributes without an RFC 2253 keyword: OID=#hex of the DER value
        (((("givenName", "Zoë"),),), "2.5.4.42=#0c045a6fc3ab"),
        (((("pseudonym", "x"),),), "2.5.4.65=#0c0178"),
        (
            ((("emailAddress", "alice@example.com"),),),
            "1.2.840.113549.1.9.1=#1611616c696365406578616d706c652e636f6d",
        ),
        (((("1.2.3.4", "custom"),),), "1.2.3.4=#0c06637573746f6d"),
        (((("commonName", "x" * 200),),), "CN=" + "x" * 200),
        (((("title", "y" * 200),),), "2.5.4.12=#0c81c8" + "79" * 200),
        ((), ""),
    ],
)
def test_distinguished_name_escaping_and_oids(
    subject: tuple[tuple[tuple[str, str], ...], ...], dn: str
) -> None:
    assert distinguished_name(subject) == dn


def test_distinguished_name_rejects_unknown_attribute_names() -> None:
    with pytest.raises(PrincipalMappingError, match="unknownThing"):
        distinguished_name(((("unknownThing", "x"),),))
