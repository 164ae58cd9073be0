"""Build the JVM fast path's jar (``reassembly/spark/jars/segmenter-jvm.jar``) from ``jvm/src``.

``python tools/build_jar.py`` compiles with ``javac --release 17`` against the jars
of the installed pyspark and writes the jar deterministically (sorted entries,
fixed timestamps and permissions, a fixed manifest), so the same source and the
same javac major give the same bytes. ``--check`` rebuilds into a temporary
directory and compares the class files with the committed jar: a difference
fails, unless this javac's major differs from the one recorded in the jar's
manifest (``X-Javac-Major``), in which case it is reported and passes, because
another javac major may legitimately emit other bytes for the same source.
``HeaderTable.java`` is rendered from ``segmenter/header_table.py`` (the rules the
Python decoder and the SQL are rendered from too) by ``tools/render.py``: the build writes it
first, so no jar is built from a stale one, and ``--check`` fails when the committed file is not
what the table renders. Users never need this: the wheel carries the jar.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import render  # tools/render.py: this script's own directory is first on sys.path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "jvm" / "src"
JAR = ROOT / "reassembly" / "spark" / "jars" / "segmenter-jvm.jar"
GENERATED = render.HEADER_TABLE_JAVA
RELEASE = "17"  # the oldest Java Spark 4 runs on
EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's earliest timestamp: every entry gets it


def javac_major() -> str:
    out = subprocess.run(["javac", "-version"], capture_output=True, text=True, check=True)
    match = re.search(r"javac (\d+)", out.stdout + out.stderr)
    if match is None:
        raise SystemExit(f"cannot read the javac version from {out.stdout + out.stderr!r}")
    return match.group(1)


def compile_classes(out: Path) -> dict[str, bytes]:
    """Compile every source file; return the class files by their path in the jar."""
    import pyspark

    classpath = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
    sources = sorted(str(p) for p in SOURCES.rglob("*.java"))
    subprocess.run(
        ["javac", "--release", RELEASE, "-encoding", "UTF-8", "-nowarn", "-cp", classpath, "-d", str(out), *sources],
        check=True,
    )
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.class"))}


def manifest(major: str) -> bytes:
    return f"Manifest-Version: 1.0\r\nX-Javac-Major: {major}\r\nX-Release: {RELEASE}\r\n\r\n".encode()


def write_jar(path: Path, classes: dict[str, bytes], major: str) -> None:
    entries = {"META-INF/MANIFEST.MF": manifest(major), **classes}
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as jar:
        for name in sorted(entries, key=lambda n: (n != "META-INF/MANIFEST.MF", n)):
            info = zipfile.ZipInfo(name, EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            jar.writestr(info, entries[name])
    tmp.replace(path)


def read_jar(path: Path) -> tuple[dict[str, bytes], str | None]:
    """The class files of a jar and the javac major its manifest records."""
    with zipfile.ZipFile(path) as jar:
        classes = {n: jar.read(n) for n in jar.namelist() if n.endswith(".class")}
        text = jar.read("META-INF/MANIFEST.MF").decode()
    match = re.search(r"X-Javac-Major: (\d+)", text)
    return classes, match.group(1) if match else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/build_jar.py")
    p.add_argument("--check", action="store_true", help="rebuild and compare with the committed jar")
    args = p.parse_args(argv)
    generated = render.java_source()
    if not args.check:
        GENERATED.write_text(generated)
    elif GENERATED.read_text() != generated:
        stale = f"{GENERATED.relative_to(ROOT)} is not what the header table renders"
        print(f"{stale}: run python tools/render.py (or python tools/build_jar.py)", file=sys.stderr)
        return 1
    major = javac_major()
    with tempfile.TemporaryDirectory() as tmp:
        built = compile_classes(Path(tmp))
    if not args.check:
        JAR.parent.mkdir(parents=True, exist_ok=True)
        write_jar(JAR, built, major)
        print(f"wrote {JAR.relative_to(ROOT)} ({len(built)} classes, javac {major}, --release {RELEASE})")
        return 0
    if not JAR.exists():
        print(f"{JAR.relative_to(ROOT)} is missing: run python tools/build_jar.py", file=sys.stderr)
        return 1
    committed, recorded = read_jar(JAR)
    if committed == built:
        print(f"{JAR.relative_to(ROOT)} matches its source ({len(built)} classes, javac {major})")
        return 0
    if recorded != major:
        print(
            f"{JAR.relative_to(ROOT)} differs from this build, but it was built by javac {recorded} and this is"
            f" javac {major}: not comparable, not failing (rebuild with javac {recorded} to check)"
        )
        return 0
    both = committed.keys() & built.keys()
    changed = sorted(set(committed) ^ set(built) | {n for n in both if committed[n] != built[n]})
    print(f"{JAR.relative_to(ROOT)} is stale ({', '.join(changed)}): run python tools/build_jar.py", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
