"""What pipeline/spark/jvm_options.py reads of spark-defaults.conf, and how pidgate's options
meet an administrator's: pure, no JVM."""

from __future__ import annotations

from pathlib import Path

from pidgate.pipeline.spark.jvm_options import (
    C1_ONLY,
    EXECUTOR_DEFAULT_JAVA_OPTIONS,
    before_administrators,
    launcher_defaults,
)


def test_the_conf_dir_s_defaults_are_read_as_java_properties(tmp_path: Path) -> None:
    (tmp_path / "spark-defaults.conf").write_text(
        "# comment\n"
        "! also a comment\n"
        "\n"
        "spark.executor.defaultJavaOptions   -Dsite=1 -Xss4m  \n"
        "spark.master=yarn\n"
        "spark.app.name: site app\n"
    )
    assert launcher_defaults({"SPARK_CONF_DIR": str(tmp_path)}) == {
        "spark.executor.defaultJavaOptions": "-Dsite=1 -Xss4m",
        "spark.master": "yarn",
        "spark.app.name": "site app",
    }


def test_spark_home_s_conf_is_read_when_no_conf_dir_is_set(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text("spark.master local[3]\n")
    assert launcher_defaults({"SPARK_HOME": str(tmp_path)}) == {"spark.master": "local[3]"}


def test_no_file_means_no_defaults(tmp_path: Path) -> None:
    assert launcher_defaults({"SPARK_CONF_DIR": str(tmp_path / "missing")}) == {}


def test_pidgate_s_options_come_before_the_administrators() -> None:
    key = EXECUTOR_DEFAULT_JAVA_OPTIONS
    assert before_administrators(C1_ONLY, key, {}) == C1_ONLY
    assert before_administrators(C1_ONLY, key, {key: "  "}) == C1_ONLY
    assert before_administrators(C1_ONLY, key, {key: "-Dsite=1"}) == f"{C1_ONLY} -Dsite=1"
