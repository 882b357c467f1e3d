"""The README's configuration reference is the one generated from the settings models."""

from __future__ import annotations

from pathlib import Path

from pidgate.config.reference import markdown_reference

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_holds_the_generated_reference_verbatim() -> None:
    table = markdown_reference()
    assert "`quota.producer.id.quota.window.size.seconds`" in table
    assert table in README.read_text(), (
        "README.md's configuration table is stale: regenerate it with "
        "`python -m pidgate.config.reference`"
    )
