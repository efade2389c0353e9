"""scripts/lab/reuse.py: the perfect-cache count and the goal that fails the reuse step (issue 31)."""
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "scripts" / "lab"
sys.path.insert(0, str(HERE))
_spec = importlib.util.spec_from_file_location("reuse", HERE / "reuse.py")
reuse = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reuse)


def test_perfect_cache_counts_each_block_once_and_the_last_token_always():
    a = list(range(10))                 # 2 whole blocks of 4 + 2 tokens
    b = a + [50, 51, 52, 53, 54]        # a's 2 blocks, then a new block and a tail
    # a: all 10 computed; b: its first 8 tokens (2 blocks) hit, 7 computed
    assert reuse.perfect_cache_tokens([a, b], 4) == 10 + 7
    # the same prompt again: a hit covers whole blocks within length - 1 (as vLLM: the last token is computed)
    assert reuse.perfect_cache_tokens([a[:8], a[:8]], 4) == 8 + 4
    # a block seen only after a different first block is no hit (a prefix, not a bag of blocks)
    assert reuse.perfect_cache_tokens([a, [99, 98, 97, 96] + a[4:]], 4) == 10 + 10


def test_the_goal_fails_the_step():
    r = {"requests": 27, "failed": 0, "failures": [], "perfect_tokens": 1000, "computed_tokens": 1100.0,
         "policy": "cache_aware"}
    assert reuse.reuse_problems(r, 1.15) == []
    assert "1.30x the perfect cache" in reuse.reuse_problems(dict(r, computed_tokens=1300.0), 1.15)[0]
    assert "failed" in reuse.reuse_problems(dict(r, failed=1, failures=[{"error": "x"}]), 1.15)[0]
    assert reuse.reuse_problems(dict(r, perfect_tokens=0), 1.15)
    assert reuse.reuse_problems(dict(r, computed_tokens=None), 1.15)


def test_metrics_parsing_sums_the_sources():
    text = ('vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 120.0\n'
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 64.0\n'
            'vllm:cache_config_info{block_size="128",cache_dtype="auto"} 1.0\n')
    assert reuse.parse_sources(text) == {"local_compute": 120.0, "local_cache_hit": 64.0}
    assert reuse.block_size_of(text) == 128


def test_router_decisions_are_read_by_outcome():
    text = ('vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="prefill",outcome="prefix_hit"} 11\n'
            'vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="prefill",outcome="missing_tokens"} 1\n')
    assert reuse.decisions(text) == {"prefix_hit": 11.0, "missing_tokens": 1.0}


def _workload():
    spec = importlib.util.spec_from_file_location("reuse_workload", HERE.parent / "bench" / "reuse_workload.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_percentile_by_nearest_rank():
    w = _workload()
    vals = [float(v) for v in range(1, 101)]
    assert (w.percentile(vals, 50), w.percentile(vals, 99), w.percentile(vals, 100)) == (50.0, 99.0, 100.0)
    assert w.percentile([None, 3.0], 50) == 3.0 and w.percentile([], 50) is None


def test_summarize_counts_the_store_tier_and_decode_sources():
    w = _workload()
    ids = [list(range(10)), list(range(10)) + [50, 51, 52, 53, 54]]
    before = {"p": {"local_compute": 100.0}}
    after_p = {"p": {"local_compute": 117.0, "external_kv_transfer": 8.0, "local_cache_hit": 0.0}}
    after_d = {"d": {"external_kv_transfer": 20.0}}
    recs = [{"ok": True, "latency": 1.0, "ttft": 0.2}, {"ok": True, "latency": 2.0, "ttft": 0.4}]
    r = w.summarize(ids, recs, 4, before, after_p, {}, after_d, 4.0)
    assert (r["perfect_tokens"], r["computed_tokens"], r["prefill_store_tokens"]) == (17, 17.0, 8.0)
    assert (r["computed_over_perfect"], r["decode_by_transfer"], r["requests_per_s"]) == (1.0, 20.0, 0.5)
    assert (r["ttft_p50_ms"], r["ttft_p99_ms"]) == (200.0, 400.0)
    bad = w.summarize(ids, recs + [{"ok": False, "error": "x", "latency": 0.1, "ttft": None}], 4, before, after_p,
                      {}, after_d, 4.0)
    assert bad["failed"] == 1


def test_reuse_report_rows_and_off_over_on_ratios(tmp_path):
    spec = importlib.util.spec_from_file_location("reuse_report", HERE.parent / "bench" / "reuse_report.py")
    rep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rep)
    base = {"requests": 12, "failed": 0, "prompt_tokens": 9000, "perfect_tokens": 3000, "decode_by_transfer": 8000,
            "decode_local_hit": 900, "requests_per_s": 0.5}
    doc = {"lab": True, "errors": [], "results": [
        dict(base, store_tier="on", policy="round_robin", computed_tokens=3300, computed_over_perfect=1.1,
             prefill_store_tokens=1200, store_ssd_hits=3, block_size=128, ttft_p50_ms=100.0, ttft_p99_ms=300.0),
        dict(base, store_tier="off", policy="round_robin", computed_tokens=4500, computed_over_perfect=1.5,
             prefill_store_tokens=0, ttft_p50_ms=150.0, ttft_p99_ms=330.0)]}
    text, rows = rep.render_csv(doc)
    # 3 SSD hits of 128-token blocks: 384 of the 1200 store tokens came from SSD
    assert rows[0]["store_memory_tokens"] == 816.0 and rows[0]["store_ssd_tokens"] == 384.0
    assert rows[1]["store_memory_tokens"] == 0.0 and rows[1]["store_ssd_tokens"] == 0.0
    assert rep.store_tiers({"prefill_store_tokens": 100, "store_ssd_hits": 5, "block_size": 128}) == (0.0, 100.0)
    assert "LAB RUN" in text
    ratio_line = [ln for ln in text.splitlines() if ln.startswith("off/on,round_robin")][0].split(",")
    assert ratio_line[rep.COLS.index("computed_over_perfect")] == "1.364" and ratio_line[-4:-1] == ["1.5", "1.1", "1.0"]
    doc["errors"] = ["off-cache_aware: failed"]
    (tmp_path / "r.json").write_text(__import__("json").dumps(doc))
    assert rep.main(["x", str(tmp_path / "r.json"), str(tmp_path / "r.csv"), str(tmp_path / "r.png")]) == 1
    assert (tmp_path / "r.png").stat().st_size > 1000 and "FAILED RUN" in (tmp_path / "r.csv").read_text()
