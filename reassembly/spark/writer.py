"""How every job of ours writes Parquet: sized for rows that are whole messages."""

from __future__ import annotations

from typing import Any

# Parquet-mr measures what a writer has buffered (against the page size, 1 MiB, and the row group
# size, 128 MiB) only after 100 rows at first, then at an estimate of half way to the limit, up to
# 10,000 rows ahead. For rows of a few KiB that is cheap and safe. Our rows are whole messages, each
# up to max_message_size: with the defaults 100 of them go into one page before the first look, so a
# task's writer holds 100 messages, not one row group, and an 8 MiB message costs a share of a
# 100-message page grown by doubling and compressed at the end (1 GiB of 8 MiB messages, reduce stage
# wall: 4.1-6.6 s with the defaults, 2.3-2.8 s with these; measured by
# ``python -m bench.sparkcase --stages`` on ``data-1024M-1024K-8``). Looking after every row bounds the
# writer by one row group plus one message; a look is a sum over the columns, nothing next to what a
# row costs.
LARGE_ROWS = {"parquet.page.size.row.check.min": "1", "parquet.page.size.row.check.max": "1"}


def parquet_writer(df: Any) -> Any:
    """``df.write`` with :data:`LARGE_ROWS` (Spark hands writer options to Parquet's Hadoop settings)."""
    return df.write.options(**LARGE_ROWS)
