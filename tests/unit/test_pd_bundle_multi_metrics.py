"""plugins/tools/pd_bundle_multi_metrics.py: MultiConnector's Prometheus metrics skip a child connector that has none
(vLLM #43828), and refuse a vLLM whose metrics class lacks what the patch reads."""
import sys
import types

import pytest

from conftest import load_patch

mm = load_patch("pd_bundle_multi_metrics")
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "PatchOnImport"]


def fake_module(with_registry=True):
    """A named fake of vLLM 0.32's multi_connector module: observe() asserts as the real one does."""
    class MultiKVConnectorPromMetrics:
        def __init__(self, prom_metrics):
            if with_registry:
                self._prom_metrics = prom_metrics
            self.seen = []

        def observe(self, transfer_stats_data, engine_idx=0):
            for connector_id, data in (transfer_stats_data or {}).items():
                assert connector_id in self._prom_metrics, "%s is not contained" % connector_id
                self.seen.append((connector_id, data, engine_idx))
    return types.SimpleNamespace(__name__=mm.MULTI_MODULE, MultiKVConnectorPromMetrics=MultiKVConnectorPromMetrics)


def test_unpatched_observe_asserts_as_vllm_does():
    m = fake_module()
    with pytest.raises(AssertionError):
        m.MultiKVConnectorPromMetrics({"MooncakeStoreConnector": 1}).observe({"MooncakeConnector": {}})


def test_patched_observe_skips_children_without_metrics(capsys):
    m = fake_module()
    mm.patch_multi(m)
    assert mm.MULTI_ACTIVE in capsys.readouterr().err
    pm = m.MultiKVConnectorPromMetrics({"MooncakeStoreConnector": 1})
    pm.observe({"MooncakeConnector": {"n": 1}, "MooncakeStoreConnector": {"n": 2}}, 0)
    assert pm.seen == [("MooncakeStoreConnector", {"n": 2}, 0)]
    pm.observe(None)
    pm.observe({})


def test_a_vllm_without_the_registry_refuses_to_start():
    m = fake_module(with_registry=False)
    mm.patch_multi(m)
    with pytest.raises(RuntimeError, match="vllm_store_tier: false"):
        m.MultiKVConnectorPromMetrics({})


def test_a_module_without_the_class_refuses():
    with pytest.raises(RuntimeError, match="has no MultiKVConnectorPromMetrics.observe"):
        mm.patch_multi(types.SimpleNamespace(__name__=mm.MULTI_MODULE))


def test_installed_only_when_the_env_file_asks(monkeypatch):
    calls = []
    monkeypatch.setattr(mm, "patch_on_import", lambda name, patch: calls.append(name))
    assert mm.install_multi_metrics({}) is False and calls == []
    assert mm.install_multi_metrics({mm.MULTI_ENV: "1"}) is True and calls == [mm.MULTI_MODULE]
