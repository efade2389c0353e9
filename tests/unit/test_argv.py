"""plugins/filter/argv.py: the benchmark router's argv is the real router's with a few values replaced."""
import importlib.util
import os

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("argv", os.path.join(REPO, "plugins/filter/argv.py"))
av = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(av)

REAL = ("--vllm-pd-disaggregation --kv-connector mooncake --prefill http://10.0.0.1:8100 8998 "
        "--decode http://10.0.0.2:8200 --host 10.0.0.9 --port 8000 --prefill-policy cache_aware")


def test_values_replaced_in_place_and_missing_flags_appended():
    out = av.argv_set(REAL, {"--host": "127.0.0.1", "--port": 8002, "--prefill-policy": "round_robin",
                             "--prometheus-port": 30002})
    assert out[out.index("--host") + 1] == "127.0.0.1" and out[out.index("--port") + 1] == "8002"
    assert out[out.index("--prefill-policy") + 1] == "round_robin"
    assert out[-2:] == ["--prometheus-port", "30002"]
    # the workers (and the prefill's bootstrap port) untouched
    assert out[3:9] == ["--prefill", "http://10.0.0.1:8100", "8998", "--decode", "http://10.0.0.2:8200", "--host"]


@pytest.mark.parametrize("argv,flag", [(REAL + " --port 9000", "--port"), ("--port", "--port"),
                                       ("--port --host x", "--port")])
def test_ambiguous_flags_refused(argv, flag):
    with pytest.raises(ValueError, match=flag):
        av.argv_set(argv, {flag: "1"})
