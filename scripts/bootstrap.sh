# Sourced by scripts/demo and scripts/test: create .venv (once) and install pidgate into it
# (again only when pyproject.toml, setup.py or a compiled module's source changed: the
# editable install compiles those only when it runs). Needs Python >= 3.11 with venv (Debian:
# python3-venv) and nothing else.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "pidgate needs Python >= 3.11 (found: $("$python" --version 2>&1))" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv || {
    echo "could not create .venv: on Debian, install python3-venv (apt-get install python3-venv)" >&2
    exit 1
  }
fi
# Extras (pyproject.toml): demo (scripts/demo), test (scripts/test: demo + analyze + tools); none
# installs the proxy alone.
extras="${BOOTSTRAP_EXTRAS:-}"  # not $1: a sourced script sees its caller's arguments
stamp=".venv/.pidgate-installed${extras:+-$extras}"
want="$(find pyproject.toml setup.py src -name pyproject.toml -o -name setup.py -o -name '*.pyx' \
  -o -name '*.pxd' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".${extras:+[$extras]}"
  echo "$want" > "$stamp"
fi
