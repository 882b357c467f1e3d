"""Rewrite the configuration table in README.md from the settings models (the table between
the header row and the next blank line). tests/config/test_reference.py fails when they drift."""

from pathlib import Path

from pidgate.config.reference import markdown_reference

readme_path = Path(__file__).resolve().parent.parent / "README.md"
readme = readme_path.read_text()
start = readme.index("| key | environment variable | default | meaning |")
end = readme.index("\n\n", start)
readme_path.write_text(readme[:start] + markdown_reference() + readme[end:])
