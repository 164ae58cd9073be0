"""``reassemble refmsg INPUT OUTPUT``: rebuild objects from reference-message chunk rows (MQRMH).

The subcommand's parsing; the job is :func:`reassembly.spark.batch.objects.run_refmsg` (same atomic
output and one-line errors as ``run``). The module is named for what it writes, objects, so it is
not mistaken for the top-level ``refmsg`` package.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from reassembly.cli._common import Progress, progress_wanted, spark_options, spark_settings

if TYPE_CHECKING:
    from reassembly.cli._common import Subparsers


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``refmsg`` subcommand."""
    p = sub.add_parser("refmsg", help="rebuild objects from reference-message chunk rows")
    p.add_argument("input", help="Parquet of encoded reference messages (binary column 'message')")
    p.add_argument("output", help="directory to create with objects/ and quarantine/ (outside the input)")
    p.add_argument("--message-column", default="message", help="binary column of encoded messages (default message)")
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    spark_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the refmsg job and print its report; 0 once the objects are written."""
    from reassembly.spark.batch.objects import run_refmsg

    settings = spark_settings(args)
    with Progress(progress_wanted(args)):
        report = run_refmsg(
            args.input, args.output, column=args.message_column, overwrite=args.overwrite, settings=settings
        )
    print(report)
    return 0
