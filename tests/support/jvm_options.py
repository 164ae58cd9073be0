"""The tests' JVM options, and a class-data archive that spares each JVM loading Spark's classes.

The JVMs the tests launch through spark-submit (the shared sessions, the command's processes,
spark-submit itself) get :data:`TEST_JVM_OPTIONS`: C1 only, one garbage-collector thread, no UI. The
suite's jobs are small and short, where C2's compiler threads cost more CPU than they save, and the
two cores are what the suite waits on (measured with ``/usr/bin/time reassemble demo --no-progress``:
29 s of CPU with the JVM's defaults, 15 s with these). What a job computes does not depend on them;
users' JVMs keep Spark's defaults. ``tests/conftest.py`` sets ``SPARK_SUBMIT_OPTS`` to them unless it
is set already (an empty value: the JVM's defaults, no archive).

The archive. A short test's driver JVM spends much of its CPU loading and verifying Spark's classes:
about 9 s of CPU for a local session's start, one count and its stop. Java's dynamic class-data
sharing writes the classes one JVM loaded to an archive at its exit (``-XX:ArchiveClassesAtExit``);
a JVM started with ``-XX:SharedArchiveFile`` maps them instead of loading them again. Measured with
``.venv/bin/python -m tests.support.jvm_options --measure`` (the CPU of ``reassemble demo
--no-progress`` with the tests' options, with and without the archive, rounds interleaved, the first
discarded): about 20 s of CPU without it, 14 s with it.

The archive changes how fast classes load, never what a job computes. The JVM checks it against its
own build and class path before it maps anything, and a JVM it does not fit (another PySpark,
another Java, the wheel's venv) runs without it: ``-Xlog:cds*=off`` keeps that fallback from printing
a warning into a command's output. A missing file is the same fallback, so a JVM started while the
archive is being built runs as if there were none.

One archive per Java, PySpark and set of JVM options, in ``.jvm_cache/`` at the top of the checkout
(``REASSEMBLY_TEST_JVM_CACHE`` moves it), written once: by ``tests/conftest.py`` when a run has
workers (``-n``) and finds none (a run that finds another process building it goes on without), or
by ``.ci/run`` beside its install, lint and quick lane. It is built under a lock, to a temporary name then
renamed, so a JVM maps a whole archive or none. ``.venv/bin/python -m
tests.support.jvm_options`` builds it by hand.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dspark.ui.enabled=false"
# The options every JVM gets with the archive: the fallback (another JVM or class path) says nothing.
_QUIET = "-Xlog:cds*=off"


def cache_dir() -> Path:
    return Path(os.environ.get("REASSEMBLY_TEST_JVM_CACHE") or ROOT / ".jvm_cache")


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else shutil.which("java") or "java"


def _key(base_options: str) -> str | None:
    """What the archive must match: the Java build, PySpark's jars and the JVM options; None
    without a Java or a PySpark."""
    try:
        import pyspark

        version = subprocess.run([_java(), "-version"], capture_output=True, text=True, timeout=60).stderr
    except (ImportError, OSError, subprocess.SubprocessError):
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    listing = sorted(f"{p.name}:{p.stat().st_size}" for p in jars.glob("*.jar")) if jars.is_dir() else []
    text = "\n".join([version, str(jars), *listing, base_options])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def archive_path(base_options: str) -> Path | None:
    key = _key(base_options)
    return None if key is None else cache_dir() / f"spark-{key}.jsa"


def with_archive(base_options: str, path: Path) -> str:
    """``base_options`` and the archive's: what a JVM maps the archive with."""
    return f"{base_options} -XX:SharedArchiveFile={path} {_QUIET}"


# What the archived JVM runs: the demo job (reading, judging, writing, the bundled jar's functions)
# and a small stream (Structured Streaming's classes), in the driver spark-submit starts, which
# exits on its own when the script ends (a JVM killed before its exit writes no archive).
_WORKLOAD = """
import sys, tempfile
from pyspark.sql import SparkSession
from reassembly.cli.main import main

if main(["demo", "--no-progress"]) != 0:
    sys.exit("the demo failed")
spark = SparkSession.builder.getOrCreate()
with tempfile.TemporaryDirectory() as d:
    spark.range(100).selectExpr("id", "cast(id as string) s").write.parquet(d + "/in")
    query = (spark.readStream.schema("id long, s string").parquet(d + "/in").groupBy("s").count()
             .writeStream.format("memory").queryName("archive_warm").outputMode("complete")
             .option("checkpointLocation", d + "/cp").trigger(availableNow=True).start())
    query.awaitTermination()
spark.stop()
"""


def build(base_options: str, *, wait: bool = True) -> Path | None:
    """The archive for ``base_options``, built if it is missing; None if it cannot be built (the
    tests then run without it, a note on stderr says why), or if another process is building it
    and not ``wait`` (``.ci/run`` builds it beside its install and quick lane, whose JVMs do without)."""
    path = archive_path(base_options)
    if path is None:
        return None
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return None  # being built by another process: this run's JVMs load their classes
        if path.exists():
            return path
        return _build_locked(base_options, path)


def _build_locked(base_options: str, path: Path) -> Path | None:
    started = time.monotonic()
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    submit = Path(sys.executable).parent / "spark-submit"
    with tempfile.TemporaryDirectory() as work:
        script = Path(work) / "workload.py"
        script.write_text(_WORKLOAD)
        env = {
            **os.environ,
            "SPARK_SUBMIT_OPTS": f"{base_options} -XX:ArchiveClassesAtExit={partial} {_QUIET}",
            "PYSPARK_PYTHON": sys.executable,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        env.pop("PYTEST_CURRENT_TEST", None)
        command = [str(submit) if submit.exists() else "spark-submit", "--master", "local[2]"]
        command += ["--conf", "spark.log.level=ERROR", str(script)]
        try:
            done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as error:
            sys.stderr.write(f"tests' JVM archive not built ({error}): the JVMs load their classes\n")
            return None
    if done.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        sys.stderr.write(f"tests' JVM archive not built (exit {done.returncode}): {' / '.join(tail)}\n")
        return None
    for old in path.parent.glob("spark-*.jsa"):  # one archive kept: an older Java's or PySpark's goes
        old.unlink(missing_ok=True)
    os.replace(partial, path)
    sys.stderr.write(f"tests' JVM archive built in {time.monotonic() - started:.0f} s: {path}\n")
    return path


def _cpu_seconds(command: list[str], env: dict[str, str]) -> float:
    """The CPU seconds of ``command`` and every process below it (waited for, or reparented and
    ended: the machine-wide counter, on a machine left idle)."""

    def used() -> float:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:4]
        return sum(int(f) for f in fields) / os.sysconf("SC_CLK_TCK")

    before = used()
    subprocess.run(command, env=env, check=True, capture_output=True)
    return used() - before


def _measure(base_options: str, rounds: int) -> None:
    path = build(base_options)
    if path is None:
        sys.exit("no archive")
    demo = [str(Path(sys.executable).parent / "reassemble"), "demo", "--no-progress"]
    cases = {"without": base_options, "with": with_archive(base_options, path)}
    seen: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(rounds + 1):  # the first round warms the disk cache and is discarded
        for name, options in cases.items():
            cpu = _cpu_seconds(demo, {**os.environ, "SPARK_SUBMIT_OPTS": options})
            if r:
                seen[name].append(cpu)
    for name, values in seen.items():
        print(f"{name} the archive: CPU median {sorted(values)[len(values) // 2]:.1f} s over {rounds} rounds")


def test_jvm_options(*, build_missing: bool) -> str:
    """:data:`TEST_JVM_OPTIONS`, with the archive's options when there is one (built first if it is
    missing, ``build_missing`` and no other process is building it)."""
    path = build(TEST_JVM_OPTIONS, wait=False) if build_missing else archive_path(TEST_JVM_OPTIONS)
    return with_archive(TEST_JVM_OPTIONS, path) if path is not None and path.exists() else TEST_JVM_OPTIONS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--measure", type=int, metavar="ROUNDS", nargs="?", const=3, help="time the demo")
    parser.add_argument("--print", action="store_true", help="print the tests' JVM options (the archive's if built)")
    args = parser.parse_args()
    if args.print:
        print(test_jvm_options(build_missing=False))
        return
    if args.measure:
        _measure(TEST_JVM_OPTIONS, args.measure)
    elif build(TEST_JVM_OPTIONS) is None:
        sys.exit(1)


if __name__ == "__main__":
    main()
