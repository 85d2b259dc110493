"""Apache Spark with Apache Iceberg's runtime, without Maven: for ``bench_iceberg.py``.

Spark normally fetches ``org.apache.iceberg:iceberg-spark-runtime`` from Maven Central
(``spark.jars.packages``), which this machine cannot reach. Everything comes from PyPI and
Debian instead (``make bench-spark-deps`` runs all of it, once):

- ``pyspark==3.5.9`` (Scala 2.12; built from its sdist, ~30 s);
- ``snowpark-connect-deps-iceberg==1.0.3``, which ships
  ``iceberg-spark-runtime-3.5_2.12-1.10.2.jar`` but without the Jackson that runtime
  shades: alone, Spark fails with ``NoClassDefFoundError:
  org/apache/iceberg/shaded/com/fasterxml/jackson/core/JsonFactoryBuilder``;
- that Jackson made here: pyspark's own ``jackson-core``/``-databind``/``-annotations``
  jars merged and relocated to ``org.apache.iceberg.shaded.com.fasterxml.jackson`` with
  jarjar (Debian ``libjarjar-java``), into ``.bench/spark/iceberg-jackson-shaded.jar``.

    python benchmarks/spark_iceberg.py build-jars .bench/spark
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
JARS_DIR = REPO / ".bench" / "spark"
SHADED = "iceberg-jackson-shaded.jar"
RUNTIME = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
JARJAR = Path("/usr/share/java/jarjar.jar")
JACKSON = re.compile(r"jackson-(core|databind|annotations)-2[.0-9]+\.jar")
RULE = "rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1\n"


class SparkMissing(Exception):
    """Spark or its Iceberg jars are not installed; the message says what to run."""


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SparkMissing(f"Python package {name} is not installed: run `make bench-spark-deps`")
    return Path(next(iter(spec.submodule_search_locations)))


def build_jars(out: Path) -> Path:
    """pyspark's Jackson merged into one jar and relocated where Iceberg's runtime looks."""
    if not JARJAR.exists():
        raise SparkMissing(f"{JARJAR} missing: apt-get install libjarjar-java")
    sources = sorted(p for p in (_package_dir("pyspark") / "jars").glob("jackson-*.jar")
                     if JACKSON.fullmatch(p.name))
    if len(sources) != 3:
        raise SparkMissing(f"pyspark's Jackson jars not found: {[p.name for p in sources]}")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        merged = Path(tmp, "jackson-merged.jar")
        seen: set[str] = set()
        with zipfile.ZipFile(merged, "w", zipfile.ZIP_DEFLATED) as sink:
            for source in sources:
                with zipfile.ZipFile(source) as jar:
                    for info in jar.infolist():
                        # Classes only: each jar's manifest and module-info would clash.
                        if info.filename in seen or info.filename.startswith("META-INF/") \
                                or info.filename.endswith("module-info.class"):
                            continue
                        seen.add(info.filename)
                        sink.writestr(info, jar.read(info))
        rules = Path(tmp, "rules.txt")
        rules.write_text(RULE)
        target = out / SHADED
        subprocess.run(["java", "-cp", str(JARJAR), "com.tonicsystems.jarjar.Main", "process",
                        str(rules), str(merged), str(target)], check=True)
    return target


def jars(jars_dir: Path = JARS_DIR) -> list[Path]:
    """The jars Spark needs beside its own: Iceberg's runtime and the relocated Jackson."""
    runtime = _package_dir("snowpark_connect_deps_iceberg") / "jars" / RUNTIME
    shaded = jars_dir / SHADED
    for path in (runtime, shaded):
        if not path.exists():
            raise SparkMissing(f"{path} missing: run `make bench-spark-deps`")
    return [runtime, shaded]


def session(jars_dir: Path = JARS_DIR, cores: int = 2) -> Any:
    """A local Spark session that reads Iceberg tables (``format("iceberg")``), in UTC."""
    extra = jars(jars_dir)
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise SparkMissing("pyspark is not installed: run `make bench-spark-deps`") from exc
    spark = (SparkSession.builder.master(f"local[{cores}]")
             .config("spark.jars", ",".join(map(str, extra)))
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


if __name__ == "__main__":
    if sys.argv[1:2] != ["build-jars"] or len(sys.argv) != 3:
        sys.exit("usage: spark_iceberg.py build-jars <dir>")
    try:
        print(build_jars(Path(sys.argv[2])))
    except SparkMissing as exc:
        sys.exit(str(exc))
