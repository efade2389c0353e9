"""plugins/tools/pd_canary.py and plugins/filter/canary.py: what a canary through a prefill x decode pair counts as
passed, failed or skipped, what it exports, and the pairs a router's canary walks."""
import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load(name, rel):
    spec = importlib.util.spec_from_file_location(name, REPO / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


canary = _load('pd_canary_under_test', 'plugins/tools/pd_canary.py')
pairs_filter = _load('canary_filter_under_test', 'plugins/filter/canary.py')

PAIR = {'prefill': 'prefill1/prefill0', 'prefill_url': 'http://10.0.0.1:8100', 'bootstrap_url': 'http://10.0.0.1:8998',
        'decode': 'decode1/decode0', 'decode_url': 'http://10.0.0.3:8200'}
METRICS = '''# HELP vllm:prompt_tokens_by_source_total x
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 500.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 1200.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="external_kv_transfer"} 30.0
'''


def test_transfer_tokens_sums_the_external_series_only():
    assert canary.transfer_tokens(METRICS) == 1230.0
    assert canary.transfer_tokens('vllm:prompt_tokens_by_source_total{source="local_compute"} 5\n') is None
    assert canary.transfer_tokens('') is None


def test_engine_id_is_the_first_rank_of_the_bootstrap_query():
    assert canary.engine_id({'1': {'engine_id': 'b'}, '0': {'engine_id': 'a', 'worker_addr': {}}}) == 'a'
    assert canary.engine_id({}) is None
    assert canary.engine_id(None) is None
    assert canary.engine_id({'0': 'garbage'}) is None


def test_the_two_requests_speak_the_routers_pd_protocol():
    pre, dec = canary.requests_for(PAIR, 'tiny', 'eng-1', 'canary-x', 'hello')
    assert pre['max_tokens'] == 1 and pre['kv_transfer_params'] == {
        'do_remote_decode': True, 'do_remote_prefill': False, 'transfer_id': 'canary-x'}
    assert dec['kv_transfer_params'] == {
        'do_remote_prefill': True, 'do_remote_decode': False, 'transfer_id': 'canary-x',
        'remote_engine_id': 'eng-1', 'remote_bootstrap_addr': 'http://10.0.0.1:8998'}
    assert pre['prompt'] == dec['prompt'] == 'hello' and pre['model'] == dec['model'] == 'tiny'


def test_prompts_never_repeat():
    # a repeated prompt would be a prefix-cache hit on decode, which moves no KV
    assert len({canary.prompt() for _ in range(50)}) == 50


def test_verdict_passes_only_when_both_answer_and_kv_arrived():
    ok = {'prefill': True, 'decode': True}
    assert canary.verdict(ok, {'prefill': 200, 'decode': 200}, 100, 140)[0] == 'pass'
    # a decode that answered without a transfer (recompute hid a failed pull) fails
    result, reason = canary.verdict(ok, {'prefill': 200, 'decode': 200}, 100, 100)
    assert result == 'fail' and 'no prompt token by transfer' in reason
    # the wedged pair: decode never answers within the timeout
    result, reason = canary.verdict(ok, {'prefill': 200, 'decode': 'timeout'}, 100, 100)
    assert result == 'fail' and 'decode timeout' in reason
    assert canary.verdict(ok, {'prefill': 500, 'decode': 200}, 0, 50)[0] == 'fail'
    # a first transfer into a decode that had exported no series yet
    assert canary.verdict(ok, {'prefill': 200, 'decode': 200}, None, 60)[0] == 'pass'


def test_an_end_not_healthy_is_skipped_not_failed():
    result, reason = canary.verdict({'prefill': True, 'decode': False}, {}, 0, 0)
    assert result == 'skip' and 'decode' in reason


def test_history_counts_failures_in_a_row_and_ignores_skips():
    h = canary.History(keep=4)
    for r in ('pass', 'fail', 'skip', 'fail', 'fail'):
        h.add(PAIR, r)
    assert h.failures(PAIR) == 3
    assert h.data[canary.History.key(PAIR)] == ['pass', 'fail', 'fail', 'fail']
    h.add(PAIR, 'pass')
    assert h.failures(PAIR) == 0
    assert len(h.data[canary.History.key(PAIR)]) == 4


def test_metrics_mark_a_pair_broken_at_the_failure_count():
    h = canary.History({canary.History.key(PAIR): ['fail', 'fail']})
    out = [(PAIR, {'result': 'fail', 'seconds': 10.0, 'tokens': 0, 'reason': 'x'})]
    h.add(PAIR, 'fail')
    text = canary.metrics('default', out, h, 1700000000, failures=3)
    lab = 'pool="default",prefill="prefill1/prefill0",decode="decode1/decode0"'
    assert 'pd_canary_success{%s} 0' % lab in text
    assert 'pd_canary_consecutive_failures{%s} 3' % lab in text
    assert 'pd_canary_broken{%s} 1' % lab in text
    assert 'pd_canary_broken{%s} 0' % lab in canary.metrics('default', out, h, 1, failures=4)
    assert 'pd_canary_last_run_timestamp_seconds{pool="default"} 1700000000' in text


def test_a_skipped_pair_exports_no_success_sample():
    text = canary.metrics('default', [(PAIR, {'result': 'skip', 'seconds': 0.0, 'tokens': 0})], canary.History(), 1, 3)
    assert 'pd_canary_success{' not in text and 'pd_canary_skipped{' in text and '} 1\n' in text


class FakeClient:
    """Recorded answers of the two instances (no network): each URL maps to (status, body)."""

    def __init__(self, answers, timeout=5.0):
        self.answers, self.timeout, self.posts = answers, timeout, []
        self.metric_reads = 0

    def get(self, url, timeout=None):
        if url.endswith('/metrics'):
            self.metric_reads += 1
            return self.answers[url][self.metric_reads - 1]
        return self.answers[url]

    def post(self, url, body):
        self.posts.append((url, body))
        return self.answers[url], ''


def _answers(decode_status=200, before='0', after='40', prefill_health=200):
    return {
        'http://10.0.0.1:8100/health': (prefill_health, ''), 'http://10.0.0.3:8200/health': (200, ''),
        'http://10.0.0.1:8998/query': (200, json.dumps({'0': {'engine_id': 'prefill1-prefill0'}})),
        'http://10.0.0.3:8200/metrics': [
            (200, 'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} %s\n' % v) for v in (before, after)],
        'http://10.0.0.1:8100/v1/completions': 200, 'http://10.0.0.3:8200/v1/completions': decode_status,
    }


def test_probe_walks_health_bootstrap_and_both_requests():
    client = FakeClient(_answers())
    out = canary.probe(client, PAIR, 'tiny')
    assert out['result'] == 'pass' and out['tokens'] == 40
    urls = sorted(u for u, _ in client.posts)
    assert urls == ['http://10.0.0.1:8100/v1/completions', 'http://10.0.0.3:8200/v1/completions']
    dec = dict(client.posts)['http://10.0.0.3:8200/v1/completions']
    assert dec['kv_transfer_params']['remote_engine_id'] == 'prefill1-prefill0'


def test_probe_fails_a_decode_that_times_out_and_skips_a_draining_prefill():
    assert canary.probe(FakeClient(_answers(decode_status='timeout', after='0')), PAIR, 'tiny')['result'] == 'fail'
    skipped = FakeClient(_answers(prefill_health=503))
    assert canary.probe(skipped, PAIR, 'tiny')['result'] == 'skip' and not skipped.posts


def test_run_writes_one_line_per_pair_and_keeps_history():
    lines, history = [], canary.History()
    config = {'pool': 'default', 'model': 'tiny', 'pairs': [PAIR]}
    canary.run(config, FakeClient(_answers(decode_status='timeout', after='0')), history, log=lines.append)
    assert history.failures(PAIR) == 1
    assert lines and 'prefill1/prefill0 -> decode1/decode0: fail' in lines[0]


def test_pairs_cover_every_prefill_and_decode_of_the_pool():
    prefills = [{'host': 'p1', 'name': 'prefill0', 'url': 'http://10.0.0.1:8100', 'bootstrap_port': 8998},
                {'host': 'p1', 'name': 'prefill1', 'url': 'http://10.0.0.1:8101', 'bootstrap_port': 8999}]
    decodes = [{'host': 'd1', 'name': 'decode0', 'url': 'http://10.0.0.3:8200'}, 'http://10.0.0.4:8200/']
    pairs = pairs_filter.canary_pairs(prefills, decodes)
    assert len(pairs) == 4
    assert pairs[1] == {'prefill': 'p1/prefill0', 'prefill_url': 'http://10.0.0.1:8100',
                        'bootstrap_url': 'http://10.0.0.1:8998', 'decode': '10.0.0.4:8200',
                        'decode_url': 'http://10.0.0.4:8200'}
    assert pairs[2]['bootstrap_url'] == 'http://10.0.0.1:8999'
    assert pairs_filter.bootstrap_url({'url': 'http://[fd00::1]:8100', 'bootstrap_port': 8998}) == 'http://[fd00::1]:8998'


# --- healing -----------------------------------------------------------------------------------------------------

def _pairs(prefills, decodes):
    return [{'prefill': p, 'decode': d, 'prefill_url': 'http://%s' % p, 'decode_url': 'http://%s' % d,
             'bootstrap_url': 'http://%s:8998' % p} for p in prefills for d in decodes]


def _history(pairs, results):
    """results: {(prefill, decode): [result, ...]}; other pairs passed twice."""
    h = canary.History()
    for p in pairs:
        for r in results.get((p['prefill'], p['decode']), ['pass', 'pass']):
            h.add(p, r)
    return h


PAIRS = _pairs(['P0', 'P1'], ['D1', 'D2'])
BROKEN = ['fail'] * 3


def test_a_healthy_pool_needs_nothing():
    assert canary.plan_heal(PAIRS, _history(PAIRS, {}), 3)[0] == 'none'
    # two failures are not yet broken
    assert canary.plan_heal(PAIRS, _history(PAIRS, {('P0', 'D1'): ['fail', 'fail']}), 3)[0] == 'none'


def test_every_pair_broken_is_the_fabric_and_restarts_nothing():
    action, target, why = canary.plan_heal(PAIRS, _history(PAIRS, {k: BROKEN for k in [
        ('P0', 'D1'), ('P0', 'D2'), ('P1', 'D1'), ('P1', 'D2')]}), 3)
    assert (action, target) == ('fabric', None) and 'all 4 pairs' in why


def test_an_instance_failing_with_every_peer_while_they_pass_elsewhere_is_wedged():
    action, target, why = canary.plan_heal(PAIRS, _history(PAIRS, {('P0', 'D1'): BROKEN, ('P0', 'D2'): BROKEN}), 3)
    assert (action, target) == ('heal', 'P0') and 'wedged' in why
    action, target, _ = canary.plan_heal(PAIRS, _history(PAIRS, {('P0', 'D2'): BROKEN, ('P1', 'D2'): BROKEN}), 3)
    assert (action, target) == ('heal', 'D2')


def test_one_wedged_pair_heals_its_prefill():
    action, target, why = canary.plan_heal(PAIRS, _history(PAIRS, {('P0', 'D1'): BROKEN}), 3)
    assert (action, target) == ('heal', 'P0') and 'pair P0 -> D1' in why


def test_an_instance_whose_peers_cannot_be_judged_is_not_healed():
    one_decode = _pairs(['P0', 'P1'], ['D1'])
    # the only decode fails with both prefills: it cannot be told from a fabric fault... which it is (all broken)
    assert canary.plan_heal(one_decode, _history(one_decode, {('P0', 'D1'): BROKEN, ('P1', 'D1'): BROKEN}), 3)[0] == 'fabric'
    # one prefill, one decode: nothing to compare with
    single = _pairs(['P0'], ['D1'])
    assert canary.plan_heal(single, _history(single, {('P0', 'D1'): BROKEN}), 3)[0] == 'none'


def _outcomes(pairs, result='fail'):
    return [(p, {'result': result}) for p in pairs]


def test_healer_gates_switch_health_rate_and_attempts():
    h = _history(PAIRS, {('P0', 'D1'): BROKEN})
    assert canary.Healer({'enabled': False}, {}, 1000).decide(PAIRS, _outcomes(PAIRS), h, 3)[0] == 'off'
    healer = canary.Healer({'enabled': True, 'interval_s': 300, 'max_attempts': 2}, {}, 1000)
    skipping = _outcomes(PAIRS[:3]) + [(PAIRS[3], {'result': 'skip', 'unhealthy': ['P1']})]
    assert healer.decide(PAIRS, skipping, h, 3)[0] == 'wait'  # one at a time: an instance is restarting
    assert healer.decide(PAIRS, _outcomes(PAIRS), h, 3)[:2] == ('heal', 'P0')
    healer.record('P0')
    assert healer.decide(PAIRS, _outcomes(PAIRS), h, 3)[0] == 'wait'  # the pool healed just now
    later = canary.Healer(healer.cfg, healer.state, 1000 + 301)
    assert later.decide(PAIRS, _outcomes(PAIRS), h, 3)[0] == 'heal'
    later.record('P0')
    much_later = canary.Healer(healer.cfg, later.state, 1000 + 700)
    action, _, why = much_later.decide(PAIRS, _outcomes(PAIRS), h, 3)
    assert action == 'gave_up' and 'healed 2 times' in why
    # its pairs pass again: the attempts start over
    much_later.decide(PAIRS, [(p, {'result': 'pass'}) for p in PAIRS], h, 3)
    assert much_later.state['targets']['P0']['attempts'] == 0 and much_later.state['targets']['P0']['count'] == 2


def test_heals_and_the_fabric_are_metrics():
    text = canary.metrics('default', [], canary.History(), 1, 3, {'targets': {'P0': {'count': 2, 'attempts': 1}}}, 1)
    assert 'pd_canary_heals_total{pool="default",healed="P0"} 2' in text
    assert 'pd_canary_fabric_broken{pool="default"} 1' in text
    assert canary.heal_url(PAIRS, 'D2') == 'http://D2' and canary.heal_url(PAIRS, 'X') is None


def test_the_heal_interval_counts_from_the_healed_instances_return():
    """Decodes' requests of the healed prefill's old process wait out vLLM's KV timeout: failures right after its
    return must not heal it again before the interval has passed since it came back."""
    h = _history(PAIRS, {('P0', 'D1'): BROKEN})
    healer = canary.Healer({'enabled': True, 'interval_s': 100, 'max_attempts': 5}, {}, 1000)
    assert healer.decide(PAIRS, _outcomes(PAIRS), h, 3)[0] == 'heal'
    healer.record('P0')
    restarting = [(p, {'result': 'skip', 'unhealthy': ['P0']}) for p in PAIRS]
    back = canary.Healer(healer.cfg, healer.state, 1090)
    assert back.decide(PAIRS, restarting, h, 3)[0] == 'wait'  # still restarting at 1090: the interval restarts
    assert canary.Healer(healer.cfg, back.state, 1150).decide(PAIRS, _outcomes(PAIRS), h, 3)[0] == 'wait'
    assert canary.Healer(healer.cfg, back.state, 1191).decide(PAIRS, _outcomes(PAIRS), h, 3)[0] == 'heal'


# --- ejection (issue 52) -----------------------------------------------------------------------------------------

class Calls:
    """The eject endpoint's calls, recorded: (url, ttl)."""

    def __init__(self, ok=True):
        self.calls, self.ok = [], ok

    def __call__(self, url, ttl, why):
        self.calls.append((url, int(ttl)))
        return self.ok, 'answered %s' % (200 if self.ok else 'ConnectionRefusedError')


def _add(h, pair_names, result):
    for p in PAIRS:
        if (p['prefill'], p['decode']) in pair_names:
            h.add(p, result)


def test_a_broken_pair_takes_its_prefill_out_of_rotation_at_once():
    h = _history(PAIRS, {('P1', 'D1'): ['fail']})
    ej, call = canary.Ejector({'failures': 1, 'ttl_s': 60}, {}, 1000), Calls()
    assert ej.step(PAIRS, h, set(), call, log=lambda _: None)[:2] == ('out', 'P1')
    assert call.calls == [('http://P1', 60)] and ej.out['P1']['side'] == 'prefill'
    # still broken on the next pair: nothing more to do (it is out already)
    assert ej.step(PAIRS, h, set(), call, log=lambda _: None)[0] == 'none' and len(call.calls) == 1


def test_a_whole_decode_cut_ends_with_the_decode_out_and_the_prefill_back():
    """Variant 2 of the partition drill, pair by pair as the walk goes: P0 -> D1 fails first (its prefill goes out),
    then P1 -> D1 (D1 fails with every peer while they pass elsewhere: D1 goes out); at the run's end P0, whose
    pairs with peers in rotation pass, comes back."""
    h = _history(PAIRS, {})
    ej, call = canary.Ejector({'failures': 1, 'ttl_s': 60}, {}, 1000), Calls()
    _add(h, {('P0', 'D1')}, 'fail')
    assert ej.step(PAIRS, h, set(), call, log=lambda _: None)[:2] == ('out', 'P0')
    _add(h, {('P1', 'D1')}, 'fail')
    assert ej.step(PAIRS, h, set(), call, log=lambda _: None)[:2] == ('out', 'D1')
    outcomes = [(p, {'result': 'fail' if p['decode'] == 'D1' else 'pass'}) for p in PAIRS]
    ej.finish(PAIRS, outcomes, call, log=lambda _: None)
    assert set(ej.out) == {'D1'} and ('http://P0', 0) in call.calls and call.calls[-1] == ('http://D1', 60)
    # the path returns: D1's pairs pass, it comes back
    ej.finish(PAIRS, [(p, {'result': 'pass'}) for p in PAIRS], call, log=lambda _: None)
    assert ej.out == {} and call.calls[-1] == ('http://D1', 0) and ej.state['count'] == {'P0': 1, 'D1': 1}


def test_the_last_prefill_or_decode_in_rotation_is_never_taken_out():
    one_decode = _pairs(['P0', 'P1'], ['D1'])
    h = _history(one_decode, {('P0', 'D1'): ['fail']})
    ej = canary.Ejector({'failures': 1}, {}, 1000)
    # P0 -> D1 broken while P1 -> D1 passes: P0 is wedged, and P1 serves; out
    assert ej.plan_out(one_decode, h)[:2] == ('out', 'P0')
    # ... but not when P1 is not healthy (restarting): P0 is then the last prefill serving
    action, target, why = ej.plan_out(one_decode, h, down={'P1'})
    assert (action, target) == ('keep', 'P0') and 'last prefill' in why
    # ... nor when P1 is out already
    ej.out['P1'] = {'side': 'prefill', 'url': 'http://P1'}
    assert ej.plan_out(one_decode, h)[0] == 'keep'


def test_at_most_max_out_per_side_and_a_fabric_fault_puts_everything_back():
    three = _pairs(['P0', 'P1', 'P2'], ['D1', 'D2'])
    h = _history(three, {('P0', 'D1'): ['fail']})
    ej, call = canary.Ejector({'failures': 1, 'max_out': 1}, {'out': {'P2': {'side': 'prefill', 'url': 'http://P2'}}},
                              1000), Calls()
    action, _, why = ej.plan_out(three, h)
    assert action == 'keep' and 'at most 1' in why
    every = _history(three, {(p['prefill'], p['decode']): ['fail'] for p in three})
    assert ej.step(three, every, set(), call, log=lambda _: None)[0] == 'fabric'
    assert ej.out == {} and call.calls == [('http://P2', 0)]


def test_an_instance_that_did_not_answer_is_not_recorded_out():
    h = _history(PAIRS, {('P1', 'D1'): ['fail']})
    ej = canary.Ejector({'failures': 1}, {}, 1000)
    ej.step(PAIRS, h, set(), Calls(ok=False), log=lambda _: None)
    assert ej.out == {}


def test_ejection_metrics_and_probing_an_ejected_instance():
    text = canary.metrics('default', [(PAIRS[0], {'result': 'pass', 'seconds': 0.1, 'tokens': 3})], canary.History(),
                          1, 3, ejected={'out': {'P0': {}}, 'count': {'P0': 2}})
    assert 'pd_canary_ejected{pool="default",instance="P0"} 1' in text
    assert 'pd_canary_ejected{pool="default",instance="D1"} 0' in text
    assert 'pd_canary_ejections_total{pool="default",instance="P0"} 2' in text
    answers = _answers()
    answers['http://10.0.0.1:8100/health'] = (503, 'ejected\n')
    assert canary.probe(FakeClient(answers), PAIR, 'tiny')['result'] == 'pass'
    answers['http://10.0.0.1:8100/health'] = (503, 'draining\n')
    assert canary.probe(FakeClient(answers), PAIR, 'tiny')['result'] == 'skip'


def test_run_confirms_a_failure_at_once_and_calls_back_after_each_pair():
    client = FakeClient(_answers(decode_status='timeout', before='5', after='5'))
    client.answers['http://10.0.0.3:8200/metrics'] = [(200, '')] * 8
    seen = []
    h = canary.History()
    out = canary.run({'pool': 'default', 'model': 'tiny', 'pairs': [PAIR]}, client, h, log=lambda _: None, confirm=1,
                     after_pair=lambda pair, so_far: seen.append(len(so_far)))
    assert out[0][1]['result'] == 'fail' and out[0][1]['probes'] == 2 and h.failures(PAIR) == 2 and seen == [1]


def test_taking_a_path_out_ends_the_requests_stuck_in_it_since_it_last_passed():
    """Item 6: the requests already inside the broken pairs are ended on their decode (POST /pd-bundle/abort), each
    since its pair's last good probe and from its prefill only."""
    h = _history(PAIRS, {})
    ej, call, aborted = canary.Ejector({'failures': 1}, {}, 1000), Calls(), []
    ej.note(PAIRS[0], {'result': 'pass', 'at': 990.5})  # P0 -> D1 passed at 990.5
    ej.note(PAIRS[0], {'result': 'fail', 'at': 995.0})  # a failure does not move it
    _add(h, {('P0', 'D1')}, 'fail')
    ej.step(PAIRS, h, set(), call, log=lambda _: None,
            abort=lambda url, since, remote, why: aborted.append((url, since, remote)) or (True, 'aborted 3'))
    assert aborted == [('http://D1', 990.5, 'http://P0:8998')]
    # at the run's end, still out: the ttl renewed and what the routers sent in since (their health-check period) ended
    ej.finish(PAIRS, [(p, {'result': 'fail' if p is PAIRS[0] else 'pass'}) for p in PAIRS], call, log=lambda _: None,
              abort=lambda url, since, remote, why: aborted.append((url, since, remote)) or (True, 'aborted 1'),
              history=h)
    assert aborted[-1] == ('http://D1', 990.5, 'http://P0:8998') and len(aborted) == 2 and 'P0' in ej.out
    # without an abort callback (or nothing broken) nothing is ended
    assert canary.Ejector({'failures': 1}, {}, 1000).stuck(PAIRS, _history(PAIRS, {}), 'P0') == []
