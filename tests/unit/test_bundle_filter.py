"""Unit tests for plugins/filter/bundle.py (pure functions; no ansible needed)."""
import importlib.util
import os

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("bundle_filter", os.path.join(REPO, "plugins", "filter", "bundle.py"))
bf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bf)

INSTANCES = [{"name": "p0", "port": 8100, "gpus": [0, 1]}, {"name": "p1", "port": 8200},
             {"name": "p2", "port": 8300, "tensor_parallel_size": 4, "gpus": [0]},
             {"name": "p3", "port": 8400, "side_channel_port": 19000, "gpus": [2, 3]}]


@pytest.mark.parametrize("inst,tp", [(INSTANCES[0], 2), (INSTANCES[1], 1), (INSTANCES[2], 4), ({}, 1),
                                     ({"gpus": []}, 1)])
def test_tp_is_explicit_else_one_per_gpu(inst, tp):
    assert bf.vllm_tp(inst) == tp


def test_side_channel_ports_from_base_by_index_one_per_rank():
    assert bf.vllm_side_channel_ports(INSTANCES[0], INSTANCES, 18100) == [18100, 18101]
    assert bf.vllm_side_channel_ports(INSTANCES[1], INSTANCES, "18100") == [18116]
    assert bf.vllm_side_channel_ports(INSTANCES[2], INSTANCES, 18100) == [18132, 18133, 18134, 18135]


def test_side_channel_port_given_wins_over_base():
    assert bf.vllm_side_channel_ports(INSTANCES[3], INSTANCES, 18100) == [19000, 19001]


@pytest.mark.parametrize("value,bytes_", [("4gb", 4 << 30), ("512MiB", 512 << 20), (1024, 1024), ("1 GB", 1 << 30)])
def test_size_bytes(value, bytes_):
    assert bf.size_bytes(value) == bytes_


@pytest.mark.parametrize("value", ["4 parsecs", 0, -1, True, "", "gb"])
def test_size_bytes_refuses(value):
    with pytest.raises(bf.AnsibleFilterError):
        bf.size_bytes(value)
