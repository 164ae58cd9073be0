"""The ``reassemble`` command as a file spark-submit can run (its primary resource)::

    spark-submit --master spark://HOST:7077 \\
        --archives env.tar.gz#environment --conf spark.pyspark.python=./environment/bin/python \\
        "$(python -c 'import reassembly.spark.engine.submit as s; print(s.__file__)')" run IN OUT

spark-submit starts the JVM with its ``--master`` and ``--conf`` settings and runs this file with the
driver's Python, exporting ``PYSPARK_GATEWAY_PORT``; the command sees it
(:func:`reassembly.spark.engine.session.submitted`) and takes spark-submit's session instead of starting
one: spark-submit's master and settings stand (the command's ``--master`` is not used), and the
library's defaults fill in only what spark-submit was not given. Arguments after the file are the
command's, as for ``reassemble``. See docs/how-to/cluster.md.

This file runs ``python -m reassembly`` (``runpy``): the command stays behind its one entry point.
A script's directory is put first on ``sys.path``; this one's holds modules named like common ones
(``session``, ``environment``, ``java``...), so it is taken off before anything else is imported.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    """Run the command with this process's arguments (``sys.argv`` after the program name), as
    ``python -m reassembly`` would."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    runpy.run_module("reassembly", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
