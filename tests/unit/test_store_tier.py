"""scripts/lab/store_tier.py: the counts that fail the store-tier lab step (issue 31)."""
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "scripts" / "lab"
sys.path.insert(0, str(HERE))
_spec = importlib.util.spec_from_file_location("store_tier", HERE / "store_tier.py")
st = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(st)


def test_loadable_tokens_are_whole_blocks_short_of_the_last_token():
    assert st.loadable_tokens(1280, 128) == 1152   # 10 blocks exactly: vLLM computes the last token's block
    assert st.loadable_tokens(1281, 128) == 1280
    assert st.loadable_tokens(100, 128) == 0
    assert st.loadable_tokens(0, 128) == 0


def _r(**kw):
    r = {"a": "p/prefill0", "b": "p/prefill1", "block_size": 32, "prompt_tokens": 1000, "loadable_tokens": 992,
         "a_put_keys": 31, "b_external_tokens": 992.0, "b_computed_tokens": 8.0, "failed": []}
    r.update(kw)
    return r


def test_the_proof_passes_only_when_every_loadable_block_came_from_the_store():
    assert st.tier_problems(_r()) == []
    out = st.tier_problems(_r(b_external_tokens=960.0, b_computed_tokens=40.0))
    assert out and "loaded 960 tokens from the store, not the prompt's 992 loadable ones" in out[0]
    assert st.tier_problems(_r(b_external_tokens=0.0))
    assert st.tier_problems(_r(failed=["HTTP 500"]))
    assert "nothing to prove" in st.tier_problems(_r(prompt_tokens=20, loadable_tokens=0, b_external_tokens=0.0))[0]


def test_store_keys_parse_and_count_successful_puts():
    text = ('vllm:mooncake_store_operation_keys_total{engine="0",model_name="m",operation="put",status="success"} 31.0\n'
            'vllm:mooncake_store_operation_keys_total{engine="0",model_name="m",operation="put",status="failed"} 2.0\n'
            'vllm:mooncake_store_operation_keys_total{engine="0",model_name="m",operation="get",status="success"} 5.0\n')
    keys = st.store_keys(text)
    assert keys[("put", "success")] == 31.0
    assert st.put_keys(keys) == 31.0


def test_segments_back_needs_every_client_active_and_mounted():
    text = "master_active_clients 2\nmaster_mount_segment_requests_total 0\nmaster_remount_segment_requests_total 2\n"
    assert st.segments_back(text, 2)
    assert not st.segments_back(text.replace("remount_segment_requests_total 2", "remount_segment_requests_total 1"), 2)
    assert not st.segments_back(text.replace("active_clients 2", "active_clients 1"), 2)
    assert not st.segments_back(None, 2)


def test_segments_back_counts_segment_owners():
    # with SSD: 2 instances give no memory, 1 host store client owns the segment and is the only active client
    text = "master_active_clients 1\nmaster_mount_segment_requests_total 0\nmaster_remount_segment_requests_total 1\n"
    assert st.segments_back(text, 1)
    assert not st.segments_back(text, 2)


def _ssd(**kw):
    s = {"leader": "etcd1", "evict_goal": 51.0, "evicted_mem": 60.0, "fillers": 7, "mem_objects_before": 10.0,
         "seconds": 20.0, "file_hits": 31.0}
    s.update(kw)
    return s


def test_the_ssd_proof_needs_the_blocks_evicted_and_served_from_ssd():
    assert st.tier_problems(_r(ssd=_ssd())) == []
    out = st.tier_problems(_r(ssd=_ssd(evicted_mem=40.0)))
    assert out and "evicted 40 objects from memory, not the 51" in out[0]
    out = st.tier_problems(_r(ssd=_ssd(file_hits=3.0)))
    assert out and "served 3 hits from SSD, not the prompt's 31 blocks" in out[0]
    # loaded from memory after all (no eviction happened): both misses are named
    assert len(st.tier_problems(_r(ssd=_ssd(evicted_mem=0.0, file_hits=0.0)))) == 2
