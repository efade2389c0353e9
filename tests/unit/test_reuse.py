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
