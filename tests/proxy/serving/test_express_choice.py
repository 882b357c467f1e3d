"""Which lane a client connection holds (issue #25): the compiled express lane where the
compiled data path runs, none under ``PIDGATE_PURE_PYTHON=1`` (tests/proxy/serving/
test_data_paths.py and tests/integration/test_express_lane.py hold both to the same behaviour).
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields
from typing import Any

import pytest

from pidgate.quota.manager import Admitted

from ...compiled_modules import import_compiled, printed_by_fresh_interpreter

EXPRESS, NOT_BUILT = import_compiled("pidgate.proxy.serving._express")


def _choice(pure_python: str | None) -> dict[str, Any]:
    code = """if True:
        import json
        from pidgate.proxy.serving import express
        print(json.dumps({
            "compiled": express.COMPILED,
            "lane": f"{express.Lane.__module__}.{express.Lane.__name__}",
        }))
    """
    return printed_by_fresh_interpreter(code, pure_python)


def test_the_express_lane_is_built_and_reads_first() -> None:
    assert EXPRESS is not None, NOT_BUILT
    choice = _choice(None)
    assert choice == {"compiled": True, "lane": "pidgate.proxy.serving._express.ExpressLane"}


def test_pidgate_pure_python_leaves_every_read_to_the_python_path() -> None:
    choice = _choice("1")
    assert choice == {"compiled": False, "lane": "pidgate.proxy.serving.express.PureLane"}


def test_the_decision_the_lane_tells_is_the_one_admit_makes() -> None:
    """The lane builds ``Admitted(new_producer_ids, 0)`` slot by slot (the frozen dataclass's
    ``__init__`` costs half a microsecond per new PID): every field equal to what ``__init__``
    sets, its hash too, and still frozen."""
    assert EXPRESS is not None, NOT_BUILT
    made, expected = EXPRESS.admitted((5, 7)), Admitted((5, 7), 0)
    assert type(made) is Admitted
    assert [getattr(made, f.name) for f in fields(Admitted)] == [
        getattr(expected, f.name) for f in fields(Admitted)
    ]
    assert made == expected and hash(made) == hash(expected)
    with pytest.raises(FrozenInstanceError):
        made.refreshed_count = 1  # type: ignore[misc]
