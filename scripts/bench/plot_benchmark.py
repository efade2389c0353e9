#!/usr/bin/env python3
"""Plot playbooks/benchmark.yml's CSV: req/s and TTFT (mean, p99) against context length, PD beside
colocated. Runs on the controller (matplotlib from requirements.txt).

  plot_benchmark.py benchmark-<time>.csv benchmark-<time>.png
"""

import csv
import io
import sys

MODES = ("pd", "colocated")
PANELS = (("req_per_s", "requests/s", "Throughput"),
          ("mean_ttft_ms", "ms", "TTFT, mean"),
          ("p99_ttft_ms", "ms", "TTFT, p99"))


def read_csv(text):
    """(rows by mode, sorted by context length; the '#' comment lines)."""
    comments = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("#")]
    body = "\n".join(ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))
    by_mode = {m: [] for m in MODES}
    for row in csv.DictReader(io.StringIO(body)):
        if row["mode"] not in by_mode:
            continue  # the pd/colocated ratio rows
        by_mode[row["mode"]].append({k: (v if k == "mode" else float(v)) for k, v in row.items() if v != ""})
    for rows in by_mode.values():
        rows.sort(key=lambda r: r["context_len"])
    return by_mode, comments


def lab_note(comments):
    return next((c for c in comments if c.startswith("LAB")), None)


def plot(by_mode, comments, out_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4.6))
    for ax, (key, unit, title) in zip(axes, PANELS):
        for mode, style in zip(MODES, ("o-", "s--")):
            rows = by_mode.get(mode) or []
            if rows:
                ax.plot([r["context_len"] for r in rows], [r[key] for r in rows], style, label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (input tokens)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    note = lab_note(comments)
    fig.suptitle("PD (vllm-router) vs colocated, vllm bench serve" + ("\n" + note if note else ""),
                 color="firebrick" if note else "black")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as fh:
        by_mode, comments = read_csv(fh.read())
    if not any(by_mode.values()):
        print("no pd or colocated rows in %s" % argv[1], file=sys.stderr)
        return 1
    plot(by_mode, comments, argv[2])
    print(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
