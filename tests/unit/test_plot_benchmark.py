"""Unit tests for scripts/bench/plot_benchmark.py (reads playbooks/benchmark.yml's CSV)."""

from __future__ import annotations

import importlib.util
import os

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("plot_benchmark", os.path.join(REPO, "scripts", "bench", "plot_benchmark.py"))
pb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pb)

CSV = """# pd-bundle serving benchmark (vllm bench serve, random dataset), 20261130T000000Z, client prefill1
# LAB RUN on vLLM-CPU (tiny-llama): these numbers say nothing about GPUs or about PD on GPUs.
context_len,mode,num_prompts,completed,failed,max_concurrency,output_len,req_per_s,output_tok_per_s,mean_ttft_ms,p99_ttft_ms,mean_tpot_ms,p99_e2el_ms
512,pd,6,6,0,2,16,0.5,8.0,900.0,1200.0,100.0,3000.0
128,pd,6,6,0,2,16,0.8,12.8,400.0,600.0,90.0,2000.0
128,colocated,6,6,0,2,16,0.7,11.2,450.0,700.0,95.0,2100.0
512,colocated,6,6,0,2,16,0.4,6.4,1000.0,1500.0,110.0,3500.0
128,pd/colocated,,,,,,1.143,1.143,0.889,0.857,0.947,0.952
"""


def test_read_csv_sorts_by_length_and_skips_ratio_rows():
    by_mode, comments = pb.read_csv(CSV)
    assert [r["context_len"] for r in by_mode["pd"]] == [128.0, 512.0]
    assert [r["req_per_s"] for r in by_mode["colocated"]] == [0.7, 0.4]
    assert set(by_mode) == {"pd", "colocated"}
    assert pb.lab_note(comments).startswith("LAB RUN on vLLM-CPU")


def test_gpu_run_has_no_lab_note():
    _, comments = pb.read_csv("\n".join(ln for ln in CSV.splitlines() if "LAB" not in ln))
    assert pb.lab_note(comments) is None


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    src, out = tmp_path / "b.csv", tmp_path / "b.png"
    src.write_text(CSV)
    assert pb.main(["plot", str(src), str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_empty_csv_is_an_error(tmp_path):
    src = tmp_path / "b.csv"
    src.write_text("# nothing\ncontext_len,mode,req_per_s\n")
    assert pb.main(["plot", str(src), str(tmp_path / "b.png")]) == 1
