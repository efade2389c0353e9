"""plugins/filter/metrics_text.py: one value from a Prometheus text exposition."""
import importlib.util
from pathlib import Path

_p = Path(__file__).resolve().parents[2] / "plugins" / "filter" / "metrics_text.py"
_spec = importlib.util.spec_from_file_location("metrics_text", _p)
mt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mt)

TEXT = """# HELP file_cache_hit_nums_ hits served from SSD
# TYPE file_cache_hit_nums_ counter
file_cache_hit_nums_ 26
file_cache_hit_bytes_total 54525952
mem_cache_hit_nums_{x="y"} 3
"""


def test_reads_the_unlabelled_series_and_only_that_name():
    assert mt.metric(TEXT, "file_cache_hit_nums_") == 26.0
    assert mt.metric(TEXT, "file_cache_hit_bytes_total") == 54525952.0
    assert mt.metric(TEXT, "file_cache_hit") == 0.0          # a prefix of a name is not the name
    assert mt.metric(TEXT, "mem_cache_hit_nums_") == 0.0     # labelled: not this reader's
    assert mt.metric("", "x") == 0.0 and mt.metric(None, "x") == 0.0
