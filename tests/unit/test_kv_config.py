"""plugins/filter/kv_config.py: the instances' kv-transfer-config (P2P, store mode, the store tier)."""
import importlib.util
import os

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("kv_config", os.path.join(REPO, "plugins/filter/kv_config.py"))
kc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kc)

P2P = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "engine_id": "p1-prefill0",
       "kv_load_failure_policy": "fail", "kv_connector_extra_config": {"mooncake_protocol": "rdma", "num_workers": 10}}


def test_p2p_unchanged_without_a_store():
    assert kc.vllm_kv_transfer_config(P2P) == P2P


def test_tier_nests_p2p_first_and_the_store_second():
    kv = kc.vllm_kv_transfer_config(P2P, store_tier=True, cache_prefix="qwen:r1")
    assert (kv["kv_connector"], kv["kv_role"], kv["engine_id"]) == ("MultiConnector", "kv_producer", "p1-prefill0")
    p2p, store = kv["kv_connector_extra_config"]["connectors"]
    # the P2P child first: MultiConnector loads from the first child with tokens, and the routers query its bootstrap
    assert p2p == {k: v for k, v in P2P.items() if k != "engine_id"}
    assert store == {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
                     "kv_connector_extra_config": {"cache_prefix": "qwen:r1"}}


def test_store_mode_gets_the_prefix_and_the_tier_is_ignored():
    store = dict(P2P, kv_connector="MooncakeStoreConnector", kv_connector_extra_config={"a": 1})
    kv = kc.vllm_kv_transfer_config(store, store_tier=True, store_mode=True, cache_prefix="m:r")
    assert kv["kv_connector"] == "MooncakeStoreConnector"
    assert kv["kv_connector_extra_config"] == {"a": 1, "cache_prefix": "m:r"}
    assert store["kv_connector_extra_config"] == {"a": 1}  # the input is not changed


def test_tier_refuses_another_connector():
    with pytest.raises(ValueError, match="behind MooncakeConnector"):
        kc.vllm_kv_transfer_config(dict(P2P, kv_connector="NixlConnector"), store_tier=True, cache_prefix="m:r")


@pytest.mark.parametrize("name,rev", [("m", ""), ("", "r"), ("m", "a@b"), ("m", "a b")])
def test_cache_prefix_refuses_empty_and_separators(name, rev):
    with pytest.raises(ValueError):
        kc.store_cache_prefix(name, rev)


def test_cache_prefix_is_name_and_revision():
    assert kc.store_cache_prefix("qwen3-32b", " 2025-04-29 ") == "qwen3-32b:2025-04-29"


def test_without_store_tier_is_the_inverse_of_the_tier():
    # the benchmark's "without the tier" side: exactly the config the instance has with vllm_store_tier false
    assert kc.without_store_tier(kc.vllm_kv_transfer_config(P2P, store_tier=True, cache_prefix="q:r")) == P2P
    assert kc.without_store_tier(P2P) == P2P
    bad = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "MooncakeStoreConnector"}]}}
    with pytest.raises(ValueError, match="exactly one MooncakeConnector"):
        kc.without_store_tier(bad)
