"""Turn results into a markdown table and PNG plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

BEGIN, END = "<!-- RESULTS:BEGIN -->", "<!-- RESULTS:END -->"


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div * 0.99:  # a 1 GiB data set is a few KiB short of 2**30 (whole messages only)
            return f"{n / div:.3g} {unit}"
    return f"{n} B"


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        f"Run {m['date']} on {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB; Python {m['python']}, "
        f"pyspark {m['pyspark']}, pyarrow {m['pyarrow']}, zstandard {m['zstandard']}, Java at {m['java_home']}"
        f"{' (quick mode)' if r['quick'] else ''}; {r['seconds_total']:.0f} s in all.",
        "",
        "**Segmenter** (cut + checksum + pack headers; floor = one CRC-32 pass over the payload)",
        "",
        "| codec | payload | segment | GB/s | floor GB/s | ratio to floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in r["segmenter"]:
        lines.append(
            f"| {c['codec']} | {_size(c['payload'])} | {_size(c['segment'])} | {c['gbps']:.2f} | "
            f"{c['floor_gbps']:.2f} | {c['ratio_to_floor']:.2f} |"
        )
    lines += [
        "",
        "**In-process assembler** (decode, verify, place, verify message; floor = one memcpy + one CRC pass)",
        "",
        "| arrival | payload | segment | GB/s | floor GB/s | ratio to floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in r["assembler"]:
        lines.append(
            f"| {c['order']} | {_size(c['payload'])} | {_size(c['segment'])} | {c['gbps']:.2f} | "
            f"{c['floor_gbps']:.2f} | {c['ratio_to_floor']:.2f} |"
        )
    if r["spark"]:
        lines += [
            "",
            "**Spark reassembly**, local[2], Parquet in and out (time: median; ratio to the floor of the same data set;"
            " peak RSS of the driver's Python process, of the JVM (driver and executor in local mode) and of all"
            " Python workers together, each data set in a fresh process)",
            "",
            "| case | data | segment | seg/msg | approach | seconds | MiB/s | vs floor | driver | JVM | Py workers |",
            "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        floors = {
            (c["kind"], c["bytes"], c["segment"], c["per_message"]): c["seconds"]
            for c in r["spark"]
            if c["approach"].startswith("(d)") and c["seconds"]
        }
        for c in r["spark"]:
            secs = c["seconds"]
            floor = floors.get((c["kind"], c["bytes"], c["segment"], c["per_message"]))
            ratio = f"{secs / floor:.2f}x" if secs and floor else "-"
            shown = f"{secs:.1f}" if secs else f"failed: {c['error']}"
            rate = f"{c['bytes'] / (1 << 20) / secs:.0f}" if secs else "-"
            lines.append(
                f"| {c['kind']} | {_size(c['bytes'])} | {_size(c['segment'])} | {c['per_message']} | {c['approach']} | "
                f"{shown} | {rate} | {ratio} | "
                + " | ".join(_size(c.get(k, 0)) for k in ("peak_driver_rss", "peak_jvm_rss", "peak_python_workers_rss"))
                + " |"
            )
    return "\n".join(lines) + "\n"


def plots(r: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for codec in ("none", "zstd"):
        for payload in sorted({c["payload"] for c in r["segmenter"]}):
            pts = [c for c in r["segmenter"] if c["codec"] == codec and c["payload"] == payload]
            if pts:
                ax.plot(
                    [c["segment"] for c in pts],
                    [c["ratio_to_floor"] for c in pts],
                    marker="o",
                    label=f"{codec}, {_size(payload)}",
                )
    ax.axhline(0.8, ls="--", c="grey", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("segment size (bytes)")
    ax.set_ylabel("throughput / CRC floor")
    ax.set_title("Segmenter vs one checksum pass")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "segmenter.png", dpi=110)
    plt.close(fig)

    spark = [c for c in r["spark"] if c["seconds"]]
    for kind, x, xlabel in (
        ("scale_size", "bytes", "data (GiB)"),
        ("scale_per_message", "per_message", "segments per message"),
    ):
        pts = [c for c in spark if c["kind"] == kind]
        if kind == "scale_size" and pts:  # the 1 and 4 GiB points are matrix cases of the same shape
            shape = (pts[0]["segment"], pts[0]["per_message"])
            approaches = {c["approach"] for c in pts}
            pts += [
                c
                for c in spark
                if c["kind"] == "matrix" and (c["segment"], c["per_message"]) == shape and c["approach"] in approaches
            ]
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for approach in sorted({c["approach"] for c in pts}):
            series = sorted((c[x], c["seconds"]) for c in pts if c["approach"] == approach)
            xs = [v / (1 << 30) if x == "bytes" else v for v, _ in series]
            ax.plot(xs, [s for _, s in series], marker="o", label=approach)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("seconds")
        ax.set_title(f"Spark reassembly: time vs {xlabel}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"spark_{kind}.png", dpi=110)
        plt.close(fig)
    matrix = [c for c in spark if c["kind"] == "matrix"]
    if matrix:
        fig, ax = plt.subplots(figsize=(8, 4))
        cases = sorted({(c["segment"], c["per_message"]) for c in matrix})
        approaches = sorted({c["approach"] for c in matrix})
        width = 0.8 / len(approaches)
        for i, approach in enumerate(approaches):
            vals = [
                next(
                    (
                        c["seconds"]
                        for c in matrix
                        if (c["segment"], c["per_message"]) == k and c["approach"] == approach
                    ),
                    0,
                )
                for k in cases
            ]
            ax.bar([j + i * width for j in range(len(cases))], vals, width, label=approach)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))])
        ax.set_xticklabels([f"{_size(s)} x{n}" for s, n in cases])
        ax.set_ylabel("seconds")
        ax.set_title("Spark reassembly by approach")
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / "spark_matrix.png", dpi=110)
        plt.close(fig)


def update_readme(path: Path, table: str) -> None:
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text:
        text += f"\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n{table}{END}{tail}")


def digest_table(cases: list[dict[str, Any]]) -> str:
    """Markdown: each digest option's time next to CRC only, as ratios to the floor (same run)."""
    floor = next((c["seconds"] for c in cases if c["approach"].startswith("(d) floor") and c["seconds"]), None)
    crc = next((c["seconds"] for c in cases if c["approach"] == "ours (validated)" and c["seconds"]), None)
    lines = ["| approach | data | seconds | ratio to floor | ratio to CRC only |", "|---|---:|---:|---:|---:|"]
    for c in cases:
        s = c["seconds"]
        if s is None:
            lines.append(f"| {c['approach']} | {_size(c['bytes'])} | failed: {c['error']} | | |")
            continue
        to_floor = f"{s / floor:.2f}" if floor else "-"
        to_crc = f"{s / crc:.2f}" if crc else "-"
        lines.append(f"| {c['approach']} | {_size(c['bytes'])} | {s:.1f} | {to_floor} | {to_crc} |")
    return "\n".join(lines) + "\n"
