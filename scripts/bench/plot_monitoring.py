#!/usr/bin/env python3
"""Plot playbooks/report.yml's Prometheus range queries: one panel each for TTFT, ITL, requests/s and decode's
KV-transfer share, one line per series (pool). Runs on the controller (matplotlib from requirements.txt).
Exits 1, naming it, when a panel has no data point: a picture of nothing proves nothing.

  plot_monitoring.py report.json report.png MINUTES
"""
import json
import math
import sys


def panels(queries):
    """{panel: [(label, [(t, value)])]} from [[{panel, name, expr}, prometheus query_range JSON]], NaN dropped."""
    out = {}
    for q, res in queries:
        lines = out.setdefault(q["panel"], [])
        for s in ((res or {}).get("data") or {}).get("result") or []:
            pts = [(float(t), float(v)) for t, v in s.get("values") or [] if not math.isnan(float(v))]
            role = s.get("metric", {}).get("role", "")
            label = " ".join(x for x in (role, q.get("name", "")) if x) or q["expr"]
            lines.append((label, pts))
    return out


def empty_panels(by_panel):
    return sorted(p for p, lines in by_panel.items() if not any(pts for _, pts in lines))


def plot(by_panel, out_png, minutes):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # One time axis for every panel: minutes before the last sample.
    t_end = max((pts[-1][0] for lines in by_panel.values() for _, pts in lines if pts), default=0)
    fig, axes = plt.subplots(2, 2, figsize=(13, 7.5))
    for ax, (panel, lines) in zip(axes.flat, by_panel.items()):
        for label, pts in lines:
            if pts:
                ax.plot([(t - t_end) / 60 for t, _ in pts], [v for _, v in pts], label=label)
        ax.set_xlim(-float(minutes), 0)
        ax.set_title(panel)
        ax.set_xlabel("minutes (0 = the last sample)")
        ax.grid(True, alpha=0.3)
        if any(pts for _, pts in lines):
            ax.legend(fontsize=8)
    fig.suptitle("pd-bundle: the last %s minutes from Prometheus (recording rules of roles/monitoring)" % minutes)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)


def main(argv):
    src, out_png, minutes = argv[1], argv[2], argv[3]
    with open(src) as f:
        by_panel = panels(json.load(f))
    empty = empty_panels(by_panel)
    plot(by_panel, out_png, minutes)
    if empty:
        print("no data in the last %s minutes for: %s (written anyway: %s)" % (minutes, ", ".join(empty), out_png),
              file=sys.stderr)
        return 1
    print("%s: %s" % (out_png, {p: sum(len(pts) for _, pts in lines) for p, lines in by_panel.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
