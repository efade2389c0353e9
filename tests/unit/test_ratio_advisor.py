"""Unit tests for plugins/filter/ratio_advisor.py: the arithmetic of the prefill:decode advisor (issue 32)."""
import importlib.util
import os

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("ratio_advisor", os.path.join(REPO, "plugins", "filter", "ratio_advisor.py"))
ra = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ra)

TARGETS = {"ttft_p99": 2.0, "itl_p99": 0.05}


def test_prefill_queue_model():
    # Service 0.5 s, queue 1.5 s: utilisation 0.75; a 2 s target allows 1 - 0.5/2 = 0.75: 4 instances are enough.
    need, why = ra.prefill_from_queue(4, 2.0, 1.5, 2.0)
    assert need == 4 and "utilisation 0.75" in why
    # The queue doubles (3 s): utilisation 0.857 > 0.75: 4 x 0.857 / 0.75 = 4.57 -> 5.
    assert ra.prefill_from_queue(4, 3.5, 3.0, 2.0)[0] == 5
    # Idle pool: shrink to the floor of 1.
    assert ra.prefill_from_queue(4, 0.3, 0.0, 2.0)[0] == 1
    # A request alone is slower than the target: no count helps, and it says so.
    need, why = ra.prefill_from_queue(2, 3.0, 0.5, 2.0)
    assert need is None and "cannot help" in why


def test_decode_load_factor():
    assert ra.decode_from_load(4, 0.1, 0.05, 0.3, 0.9)[0] == 8          # ITL twice the target
    need, why = ra.decode_from_load(4, 0.02, 0.05, 0.99, 0.9)           # KV cache full
    assert need == 5 and "KV use" in why
    assert ra.decode_from_load(4, 0.01, 0.05, 0.1, 0.9)[0] == 1


def test_curves_win_where_a_sweep_exists():
    curves = {"prefill": [{"prompt_tokens": 1024, "ttft_p99_s": 0.4, "tokens_per_s": 20000},
                          {"prompt_tokens": 1024, "ttft_p99_s": 3.0, "tokens_per_s": 30000},
                          {"prompt_tokens": 4096, "ttft_p99_s": 1.5, "tokens_per_s": 25000}],
              "decode": [{"concurrency": 32, "itl_p99_s": 0.03}, {"concurrency": 64, "itl_p99_s": 0.045},
                         {"concurrency": 128, "itl_p99_s": 0.08}]}
    obs = {"rate": 50, "prompt_tokens": 1000, "output_tokens": 200, "ttft_p99": 1.0, "itl_p99": 0.04}
    adv = ra.ratio_advice(obs, TARGETS, curves, now={"prefill": 2, "decode": 2}, spare_hosts=["s1", "s2"],
                          per_host={"prefill": 1, "decode": 1})
    # 50 x 1000 / 20000 (the 3 s point misses the target) = 2.5 -> 3
    assert adv["prefill"]["need"] == 3 and adv["prefill"]["basis"] == "sweep"
    # 50 x 200 x 0.05 = 500 streams / 64 = 7.8 -> 8
    assert adv["decode"]["need"] == 8 and adv["decode"]["basis"] == "sweep"
    assert adv["ratio"] == "3:8"
    assert adv["changes"][0] == "prefill: 2 -> 3 instance(s): move s1 from vllm_spare to vllm_prefill"
    assert adv["changes"][1] == "decode: 2 -> 8 instance(s): move s2 from vllm_spare to vllm_decode; add 5 new host(s) to vllm_decode"


def test_without_a_sweep_it_says_so_and_uses_the_observed_point():
    obs = {"rate": 2, "prompt_tokens": 300, "output_tokens": 16, "ttft_p99": 1.0, "prefill_queue_p99": 0.2,
           "itl_p99": 0.02, "decode_kv_usage": 0.1}
    adv = ra.ratio_advice(obs, TARGETS, None, now={"prefill": 2, "decode": 2}, per_host={"prefill": 2, "decode": 1})
    assert adv["prefill"]["basis"] == "queue" and "no prefill sweep" in adv["prefill"]["why"]
    assert adv["decode"]["basis"] == "load" and "no decode sweep" in adv["decode"]["why"]
    # rho = 0.2 / 1.0 = 0.2, allowed 1 - 0.8/2 = 0.6: 2 x 0.2/0.6 = 0.67 -> 1; decode 0.02/0.05 = 0.4 -> 1
    assert (adv["prefill"]["need"], adv["decode"]["need"]) == (1, 1)
    assert adv["changes"] == ["prefill: 2 -> 1 instance(s): move 1 host(s) from vllm_prefill to vllm_spare",
                              "decode: 2 -> 1 instance(s): move 1 host(s) from vllm_decode to vllm_spare"]


def test_no_traffic_keeps_the_fleet():
    adv = ra.ratio_advice({"rate": 0}, TARGETS, None, now={"prefill": 2, "decode": 3})
    assert (adv["prefill"]["need"], adv["decode"]["need"]) == (2, 3)
    assert adv["changes"] == ["prefill: keep 2 instance(s)", "decode: keep 3 instance(s)"]
