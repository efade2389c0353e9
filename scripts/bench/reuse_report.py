#!/usr/bin/env python3
"""The reuse benchmark's CSV and PNG from playbooks/benchmark.yml's JSON (benchmark_workload=reuse): per store tier
(on/off) and router policy, prefill tokens computed / a perfect cache's, the store tier's tokens by tier (memory,
SSD: the masters' SSD hits, one per block), decode's tokens by transfer and found locally, TTFT p50/p99 and requests/s; then, per policy, the
ratios without / with the tier (side by side in one run). Runs on the controller (matplotlib, requirements.txt).

  reuse_report.py reuse-<time>.json reuse-<time>.csv reuse-<time>.png
"""
import csv
import io
import json
import sys

COLS = ("store_tier", "policy", "requests", "failed", "prompt_tokens", "perfect_tokens", "computed_tokens",
        "computed_over_perfect", "prefill_cache_hit_tokens", "store_memory_tokens", "store_ssd_tokens",
        "decode_by_transfer", "decode_local_hit", "ttft_p50_ms", "ttft_p99_ms", "requests_per_s",
        "router_prefix_decisions")
RATIO_KEYS = ("computed_over_perfect", "ttft_p50_ms", "ttft_p99_ms", "requests_per_s")


def rows_of(results):
    """One CSV row per run, in the order run (the tier as deployed first)."""
    out = []
    for r in results:
        row = {k: r.get(k) for k in COLS}
        row["store_memory_tokens"], row["store_ssd_tokens"] = store_tiers(r)
        row["router_prefix_decisions"] = " ".join(f"{k}={v:.0f}" for k, v in sorted((r.get("router_decisions") or {}).items()))
        out.append(row)
    return out


def store_tiers(r):
    """(memory, SSD) tokens of the store's hits. vLLM counts them together (prefill's external tokens); the masters
    count the SSD hits in blocks (store_ssd_hits), so SSD = those blocks in tokens, capped by the total."""
    total = r.get("prefill_store_tokens")
    if total is None:
        return None, None
    ssd = min(float(r.get("store_ssd_hits") or 0) * float(r.get("block_size") or 0), float(total))
    return float(total) - ssd, ssd


def ratios(rows):
    """[(policy, {key: off / on})] for every policy measured both ways."""
    by = {(r["store_tier"], r["policy"]): r for r in rows}
    out = []
    for (tier, policy), on in by.items():
        off = by.get(("off", policy))
        if tier != "on" or not off:
            continue
        out.append((policy, {k: (round(float(off[k]) / float(on[k]), 3) if on.get(k) not in (None, "", 0) and
                                 off.get(k) not in (None, "") else "") for k in RATIO_KEYS}))
    return out


def render_csv(doc):
    rows = rows_of(doc.get("results") or [])
    buf = io.StringIO()
    buf.write("# pd-bundle reuse benchmark (playbooks/benchmark.yml -e benchmark_workload=reuse)\n")
    if doc.get("lab"):
        buf.write("# LAB RUN on vLLM-CPU: the token counts hold anywhere; the times say nothing about GPUs.\n")
    buf.write("# computed_over_perfect: prefill tokens computed / a cache that computes every distinct prefix block "
              "once (1.00 = perfect)\n# ratio rows: store tier off / on, per policy\n")
    for e in doc.get("errors") or []:
        buf.write(f"# FAILED RUN: {e}\n")
    w = csv.DictWriter(buf, fieldnames=COLS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    for policy, rat in ratios(rows):
        w.writerow(dict(rat, store_tier="off/on", policy=policy))  # each ratio under its own column
    return buf.getvalue(), rows


def plot(rows, lab, out_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    tiers = list(dict.fromkeys(r["store_tier"] for r in rows))
    panels = (("computed_over_perfect", "x perfect cache", "Prefill computed / perfect cache"),
              ("ttft_p50_ms", "ms", "TTFT p50"), ("ttft_p99_ms", "ms", "TTFT p99"),
              ("requests_per_s", "requests/s", "Throughput"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4))
    width = 0.8 / max(1, len(tiers))
    for ax, (key, unit, title) in zip(axes, panels):
        for i, tier in enumerate(tiers):
            vals = [next((float(r[key]) for r in rows if r["policy"] == p and r["store_tier"] == tier
                          and r.get(key) not in (None, "")), 0.0) for p in policies]
            ax.bar([x + i * width for x in range(len(policies))], vals, width, label=f"store tier {tier}")
        if key == "computed_over_perfect":
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks([x + width * (len(tiers) - 1) / 2 for x in range(len(policies))])
        ax.set_xticklabels(policies, rotation=20, fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(unit)
    axes[0].legend(fontsize=8)
    fig.suptitle("Reuse workload per router policy" + (" (LAB, vLLM-CPU: times say nothing about GPUs)" if lab else ""))
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)


def main(argv):
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    doc = json.load(open(argv[1], encoding="utf-8"))
    text, rows = render_csv(doc)
    with open(argv[2], "w", encoding="utf-8") as fh:
        fh.write(text)
    if rows:
        plot(rows, doc.get("lab"), argv[3])
    print(text, end="")
    print(f"CSV: {argv[2]}" + (f"\nPNG: {argv[3]}" if rows else "\nno run completed: no PNG"))
    return 1 if doc.get("errors") or not rows else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
