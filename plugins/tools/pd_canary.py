#!/usr/bin/env python3
"""A canary through every prefill x decode pair of one model pool: prefill -> KV transfer -> decode.

Why: a pair can be wedged while both ends answer /health 200 and a fresh transfer engine (status's matrix) moves
data fine. Seen on the lab: after 40 s of dropped packets between a prefill and a decode, the pair stayed broken for
over 10 minutes ("Timeout waiting for P side ready", "transfer failed: Resource temporarily unavailable") until the
prefill restarted, and nothing but a latency alert noticed. Only a real request through the instances' own
connectors sees it.

One run (a systemd timer starts it) sends, per pair, one tiny request the way vllm-router's Mooncake PD mode does:
prefill and decode at once with one transfer_id; prefill gets max_tokens 1 and do_remote_decode, decode gets
do_remote_prefill with the prefill's engine id (read from its bootstrap server's /query) and bootstrap address. The
prompt starts with a random nonce, so neither end finds it in its prefix cache and decode must take the KV by transfer.

A pair passes when both answers are 200 within the timeout and decode's
vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} grew while the canary ran (the pairs of one decode
run one after another; another request's transfer into the same decode at the same moment counts too, so the token
count is a floor of proof, not the canary's own figure). A pair one of whose ends is not healthy (down, starting,
draining: /health not 200) is skipped, not failed: the routers already avoid it, and a rolling restart must not
raise an alarm. The canary talks to the instances directly, never through a router, so its failure fails no client.

Out: the node exporter's textfile (pd_canary_*{pool,prefill,decode}), a state file with each pair's last results
(status's canary column reads it) and one journal line per pair. The vLLM key comes from the environment
(VLLM_ROUTER_API_KEY, the router's 0600 key file), never from the command line.

Healing (config "heal", on the pool's first router host only, so one decides): after a run in which every instance of
the pool answered /health 200, plan_heal reads the pairs' results:
- every pair broken (FAILURES in a row): a fabric fault. No restart can fix it; pd_canary_fabric_broken and its
  alert say so;
- an instance whose pairs are all broken while each of its peers passes with another instance: that instance is
  wedged;
- one broken pair whose prefill and decode both pass with other peers: the pair is wedged; its prefill is healed (on
  the lab a wedged pair stayed broken until its prefill restarted; restarting its decode did not help).
The target is healed by POST /pd-bundle/heal on the instance (the drain middleware, plugins/tools/pd_bundle_drain.py):
it drains like a rolling restart and ends its process, which systemd restarts. At most one heal per pool per
heal interval, and at most max_attempts heals of one target until its pairs pass again (a path that stays cut is the
network's to fix, not a restart loop's). Each heal is a journal line and pd_canary_heals_total.
"""
import argparse
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

KEY_ENV = 'VLLM_ROUTER_API_KEY'
TRANSFER_SERIES = 'vllm:prompt_tokens_by_source_total'
TRANSFER_SOURCE = 'external_kv_transfer'
# A plain-word prompt: any tokenizer splits it into a few dozen tokens.
WORDS = ('amber basalt cobalt delta ember fjord granite harbor indigo jasper kelp lumen meadow nickel onyx pebble '
         'quartz river slate tundra umber violet willow xenon yarrow zephyr').split()
RESULTS = ('pass', 'fail', 'skip')
# What an instance's /health says while the ejector holds it out of rotation (plugins/tools/pd_bundle_drain.py).
EJECTED = 'ejected'


def transfer_tokens(metrics_text):
    """Decode's prompt tokens that arrived by KV transfer, summed over its label sets; None when the series is
    absent (an instance that has not counted one yet exports no series: read as 0 by the caller)."""
    total, seen = 0.0, False
    for line in (metrics_text or '').splitlines():
        if not line.startswith(TRANSFER_SERIES + '{') or ('source="%s"' % TRANSFER_SOURCE) not in line:
            continue
        try:
            total += float(line.rsplit(None, 1)[1])
            seen = True
        except (IndexError, ValueError):
            continue
    return total if seen else None


def engine_id(query):
    """The engine id a prefill's bootstrap /query names (its first data-parallel rank), or None."""
    if not isinstance(query, dict) or not query:
        return None
    first = query[sorted(query, key=str)[0]]
    return first.get('engine_id') if isinstance(first, dict) else None


def prompt(rng=random):
    return 'canary %s: %s' % (uuid.uuid4().hex, ' '.join(rng.choice(WORDS) for _ in range(24)))


def requests_for(pair, model, engine, transfer_id, text):
    """The two bodies of one PD request (vllm-router 0.1.17's Mooncake mode): prefill's, decode's."""
    pre = {'model': model, 'prompt': text, 'max_tokens': 1, 'temperature': 0, 'stream': False,
           'kv_transfer_params': {'do_remote_decode': True, 'do_remote_prefill': False, 'transfer_id': transfer_id}}
    dec = {'model': model, 'prompt': text, 'max_tokens': 2, 'temperature': 0, 'stream': False,
           'kv_transfer_params': {'do_remote_prefill': True, 'do_remote_decode': False, 'transfer_id': transfer_id,
                                  'remote_engine_id': engine, 'remote_bootstrap_addr': pair['bootstrap_url']}}
    return pre, dec


def verdict(health_ok, answers, tokens_before, tokens_after):
    """(result, reason) of one pair: skip when an end is not healthy; pass when both answered 200 and decode's
    transfer counter grew; fail otherwise."""
    if not all(health_ok.values()):
        return 'skip', 'not healthy: %s' % ', '.join(sorted(k for k, ok in health_ok.items() if not ok))
    bad = ['%s %s' % (k, v) for k, v in sorted(answers.items()) if v != 200]
    if bad:
        return 'fail', 'answered ' + ', '.join(str(b) for b in bad)
    grew = (tokens_after or 0) - (tokens_before or 0)
    if grew <= 0:
        return 'fail', 'decode counted no prompt token by transfer (policy recompute, or the KV never came)'
    return 'pass', '%d tokens by transfer' % grew


class History:
    """The last results of each pair (skips left out), kept in a JSON state file across runs."""

    def __init__(self, data=None, keep=10):
        self.data = dict(data or {})
        self.keep = keep

    @staticmethod
    def key(pair):
        return '%s|%s' % (pair['prefill'], pair['decode'])

    def add(self, pair, result):
        if result == 'skip':
            return
        runs = (self.data.get(self.key(pair)) or [])[-(self.keep - 1):] + [result]
        self.data[self.key(pair)] = runs

    def failures(self, pair):
        """Consecutive failures up to the last result."""
        n = 0
        for r in reversed(self.data.get(self.key(pair)) or []):
            if r != 'fail':
                break
            n += 1
        return n


def plan_heal(pairs, history, failures):
    """('fabric', None, why) when every pair with results is broken; ('heal', instance, why) for a wedged instance or
    a wedged pair's prefill; ('none', None, why) otherwise. Pure: the caller gates it (health, rate, attempts).
    The ejector (Ejector) reads the same judgement with its own, shorter, failure count."""
    known = [p for p in pairs if history.data.get(History.key(p))]
    broken = {History.key(p) for p in known if history.failures(p) >= failures}
    passing = {History.key(p) for p in known if history.data[History.key(p)][-1] == 'pass'}
    if not broken:
        return 'none', None, 'no pair broken'
    if len(known) >= 2 and len(broken) == len(known):
        return 'fabric', None, 'all %d pairs broken: a fabric fault, which no restart fixes' % len(known)

    def peers_pass_elsewhere(side, name):
        """Each peer of instance NAME (on SIDE) passes with some other instance of SIDE; False if one cannot be judged."""
        other = 'decode' if side == 'prefill' else 'prefill'
        mine = [p for p in known if p[side] == name]
        for pair in mine:
            if not any(History.key(q) in passing for q in known if q[other] == pair[other] and q[side] != name):
                return False
        return bool(mine)

    for side in ('prefill', 'decode'):
        for name in dict.fromkeys(p[side] for p in known):
            mine = [History.key(p) for p in known if p[side] == name]
            if all(k in broken for k in mine) and peers_pass_elsewhere(side, name):
                return 'heal', name, '%s %s fails with every peer (%d) while they pass with others: wedged' % (
                    side, name, len(mine))
    for pair in known:
        if History.key(pair) not in broken:
            continue
        p_ok = any(History.key(q) in passing for q in known if q['prefill'] == pair['prefill'])
        d_ok = any(History.key(q) in passing for q in known if q['decode'] == pair['decode'])
        if p_ok and d_ok:
            return 'heal', pair['prefill'], 'pair %s -> %s broken while both ends pass with others: its prefill' % (
                pair['prefill'], pair['decode'])
    return 'none', None, 'broken pairs, but no wedged instance can be told from them'


class Healer:
    """The gates around plan_heal, and the heal request. state: the 'heals' part of the state file."""

    def __init__(self, config, state, now):
        self.cfg = config or {}
        self.state = dict(state or {})
        self.state.setdefault('targets', {})
        self.now = now

    def decide(self, pairs, outcomes, history, failures):
        """(action, target, why) after the gates: healing on, every instance healthy this run, the pool's rate, the
        target's attempts. A target whose pairs all passed this run has its attempts reset."""
        for name, t in self.state['targets'].items():
            mine = [o for p, o in outcomes if name in (p['prefill'], p['decode'])]
            if mine and all(o['result'] == 'pass' for o in mine):
                t['attempts'] = 0
        action, target, why = plan_heal(pairs, history, failures)
        if action != 'heal':
            return action, target, why
        if not self.cfg.get('enabled'):
            return 'off', target, why + '; healing is off (vllm_router_canary_heal)'
        down = {n for _, o in outcomes for n in o.get('unhealthy') or []}
        if self.state.get('healed') in down:
            # The instance healed last is still restarting: the interval counts from its return, so a decode's requests
            # of its previous process (they wait out vLLM's KV timeout) are not read as a new wedge.
            self.state['last'] = self.now
        if down:
            return 'wait', target, why + '; an instance of the pool is not healthy (restarting or draining): one at a time'
        last = self.state.get('last', 0)
        if self.now - last < float(self.cfg.get('interval_s', 300)):
            return 'wait', target, why + '; the pool healed %ds ago (at most one heal per %ss)' % (
                self.now - last, self.cfg.get('interval_s'))
        t = self.state['targets'].setdefault(target, {'count': 0, 'attempts': 0})
        if t['attempts'] >= int(self.cfg.get('max_attempts', 2)):
            return 'gave_up', target, why + '; healed %d times without its pairs passing: left to a person' % t['attempts']
        return 'heal', target, why

    def record(self, target):
        t = self.state['targets'].setdefault(target, {'count': 0, 'attempts': 0})
        t['count'] += 1
        t['attempts'] += 1
        self.state['last'] = self.now
        self.state['healed'] = target


class Ejector:
    """Taking a broken path out of every router's rotation without a restart (issue 52), and putting it back.

    Decided on the pool's first router host only (as healing), while the run goes (after each pair's probes, so a
    broken path leaves within one run), from the same judgement as plan_heal at the eject failure count:
    - the target plan_heal names (a wedged instance, or a broken pair's prefill) is taken out (POST
      /pd-bundle/eject on the instance: its /health answers 503 "ejected", and every router of the pool, smg or
      vllm-router, drops it at its next health check), unless it is the last prefill or decode of the pool in
      rotation (counting instances out and instances not healthy), or its side already has max_out instances out;
    - every pair broken (a fabric fault): nothing is taken out, and what is out is put back (no instance is to blame;
      pd_canary_fabric_broken and its alert say so);
    - an instance out comes back (ttl 0) once every pair of it with a peer in rotation passed in the run; the canary
      talks to the instances directly, so it still probes an instance that no router sends to. While it stays out,
      each run renews its ttl: a canary that stops cannot leave it out for good.
    state: the 'ejected' part of the state file: {'out': {name: {since, why, side, url}}, 'count': {name: n}}."""

    def __init__(self, config, state, now):
        self.cfg = config or {}
        self.state = {'out': dict((state or {}).get('out') or {}), 'count': dict((state or {}).get('count') or {})}
        self.now = now

    @property
    def out(self):
        return self.state['out']

    @staticmethod
    def members(pairs):
        """{name: (side, url)} of every instance of the pool."""
        out = {}
        for pair in pairs:
            for side in ('prefill', 'decode'):
                out.setdefault(pair[side], (side, pair[side + '_url']))
        return out

    def plan_out(self, pairs, history, down=()):
        """(action, target, why): 'out' a target to take out now; 'keep' a target left in rotation (why); 'fabric';
        'none'."""
        failures = int(self.cfg.get('failures', 1))
        action, target, why = plan_heal(pairs, history, failures)
        if action == 'fabric':
            return 'fabric', None, why
        if action != 'heal' or target in self.out:
            return 'none', None, why
        members = self.members(pairs)
        side = members[target][0]
        serving = [n for n, (s, _) in members.items() if s == side and n != target and n not in down and n not in self.out]
        if not serving:
            return 'keep', target, why + '; it is the last %s of the pool in rotation: left in' % side
        max_out = int(self.cfg.get('max_out', 1))
        if sum(1 for o in self.out.values() if o.get('side') == side) >= max_out:
            return 'keep', target, why + '; %d %s already out of rotation (at most %d): left in' % (max_out, side, max_out)
        return 'out', target, why

    def plan_back(self, pairs, outcomes):
        """[(name, why)]: instances out whose pairs with a peer in rotation all passed in this run (or that left
        the pool)."""
        members = self.members(pairs)
        back = []
        for name in sorted(self.out):
            if name not in members:
                back.append((name, 'no longer a member of the pool'))
                continue
            side = members[name][0]
            other = 'decode' if side == 'prefill' else 'prefill'
            mine = [o['result'] for p, o in outcomes if p[side] == name and p[other] not in self.out]
            mine = [r for r in mine if r != 'skip']
            if mine and all(r == 'pass' for r in mine):
                back.append((name, 'every pair of it with a peer in rotation passed (%d)' % len(mine)))
        return back

    def note(self, pair, outcome):
        """Remember when a pair last passed (the start of its passing probe): requests sent to it later may be
        inside the broken path."""
        if outcome.get('result') == 'pass' and outcome.get('at'):
            self.state.setdefault('passed_at', {})[History.key(pair)] = outcome['at']

    def stuck(self, pairs, history, target):
        """[(decode_url, since, bootstrap_url)] of the broken pairs of TARGET: where requests may wait for KV that
        cannot come (on the pair's decode, from the pair's prefill, sent since the pair last passed)."""
        failures = int(self.cfg.get('failures', 1))
        passed = self.state.get('passed_at') or {}
        return [(p['decode_url'], passed.get(History.key(p), self.now - 60), p['bootstrap_url']) for p in pairs
                if target in (p['prefill'], p['decode']) and history.failures(p) >= failures]

    def take_out(self, name, side, url, why, call, log, abort=None, stuck=()):
        ok, detail = call(url, float(self.cfg.get('ttl_s', 120)), why)
        log('canary eject: took %s out of rotation (%s): %s' % (name, why, detail))
        if ok:
            self.out[name] = {'since': self.now, 'why': why, 'side': side, 'url': url}
            self.state['count'][name] = int(self.state['count'].get(name, 0)) + 1
            # The requests already inside the broken path: ended now (503, retryable) rather than left to wait out
            # the connector's KV timeout (issue 52 item 6).
            for decode_url, since, bootstrap in stuck if abort else ():
                log('canary eject: requests waiting on %s for KV from %s: %s' % (
                    decode_url, bootstrap, abort(decode_url, since, bootstrap, why)[1]))
        return ok

    def put_back(self, name, why, call, log):
        url = self.out.get(name, {}).get('url')
        ok, detail = call(url, 0, why) if url else (True, 'no address')
        log('canary eject: put %s back in rotation (%s): %s' % (name, why, detail))
        if ok:
            self.out.pop(name, None)
        return ok

    def step(self, pairs, history, down, call, log=print, abort=None):
        """After a pair's probes: take out what plan_out names (and end the requests stuck in its broken pairs);
        on a fabric fault, put everything back."""
        action, target, why = self.plan_out(pairs, history, down)
        if action == 'out':
            side, url = self.members(pairs)[target]
            self.take_out(target, side, url, why, call, log, abort, self.stuck(pairs, history, target))
        elif action == 'fabric':
            for name in sorted(self.out):
                self.put_back(name, why + ': nothing is taken out', call, log)
        return action, target, why

    def finish(self, pairs, outcomes, call, log=print, abort=None, history=None):
        """After the run: put back what passed, renew the ttl of what stays out, and end again what waits in its
        broken pairs (requests the routers sent in the health-check period after the ejection)."""
        for name, why in self.plan_back(pairs, outcomes):
            self.put_back(name, why, call, log)
        for name, o in sorted(self.out.items()):
            ok, detail = call(o['url'], float(self.cfg.get('ttl_s', 120)), 'still broken: ' + o.get('why', ''))
            if not ok:
                log('canary eject: could not renew %s out of rotation: %s' % (name, detail))
            for decode_url, since, bootstrap in (self.stuck(pairs, history, name) if abort and history else ()):
                ok, detail = abort(decode_url, since, bootstrap, 'still broken: ' + o.get('why', ''))
                if detail and not detail.endswith('aborted 0'):
                    log('canary eject: requests waiting on %s for KV from %s: %s' % (decode_url, bootstrap, detail))
        return self.state


def heal_url(pairs, target):
    for pair in pairs:
        for side in ('prefill', 'decode'):
            if pair[side] == target:
                return pair[side + '_url']
    return None


def _esc(value):
    """A Prometheus label value."""
    return str(value).replace('\\', '\\\\').replace('"', '\\"')


def _labels(pool, pair):
    return 'pool="%s",prefill="%s",decode="%s"' % (_esc(pool), _esc(pair['prefill']), _esc(pair['decode']))


def metrics(pool, outcomes, history, now, failures, heals=None, fabric=None, ejected=None):
    """The textfile: per pair its last result (success 1/0, absent while it has only skipped), latency, transfer
    tokens, consecutive failures, broken (FAILURES or more of them) and whether the last run skipped it; and the run's
    time."""
    lines = [
        '# HELP pd_canary_success 1 when the last canary through this prefill x decode pair passed, 0 when it failed.',
        '# TYPE pd_canary_success gauge']
    body = {'latency': [], 'tokens': [], 'fails': [], 'broken': [], 'skip': []}
    for pair, o in outcomes:
        lab = _labels(pool, pair)
        if o['result'] != 'skip':
            lines.append('pd_canary_success{%s} %d' % (lab, o['result'] == 'pass'))
            body['latency'].append('pd_canary_latency_seconds{%s} %.3f' % (lab, o['seconds']))
            body['tokens'].append('pd_canary_transfer_tokens{%s} %d' % (lab, o['tokens']))
        body['fails'].append('pd_canary_consecutive_failures{%s} %d' % (lab, history.failures(pair)))
        body['broken'].append('pd_canary_broken{%s} %d' % (lab, history.failures(pair) >= failures))
        body['skip'].append('pd_canary_skipped{%s} %d' % (lab, o['result'] == 'skip'))
    for name, kind, text, key in (
            ('pd_canary_latency_seconds', 'gauge', 'Seconds the last canary of the pair took (prefill and decode).', 'latency'),
            ('pd_canary_transfer_tokens', 'gauge', "Decode's prompt tokens by KV transfer while the last canary ran.", 'tokens'),
            ('pd_canary_consecutive_failures', 'gauge', 'Canaries of the pair that failed in a row (skips not counted).', 'fails'),
            ('pd_canary_broken', 'gauge', '1 when the pair failed its last canaries in a row (the failures setting).', 'broken'),
            ('pd_canary_skipped', 'gauge', '1 when the last run skipped the pair (an end not healthy).', 'skip')):
        lines += ['# HELP %s %s' % (name, text), '# TYPE %s %s' % (name, kind)] + body[key]
    if heals is not None:
        lines += ['# HELP pd_canary_heals_total Instances this canary drained and restarted because they were wedged.',
                  '# TYPE pd_canary_heals_total counter']
        lines += ['pd_canary_heals_total{pool="%s",healed="%s"} %d' % (_esc(pool), _esc(name), t['count'])
                  for name, t in sorted((heals.get('targets') or {}).items())]
    if ejected is not None:
        members = sorted({p[side] for p, _ in outcomes for side in ('prefill', 'decode')} | set(ejected.get('out') or {}))
        lines += ['# HELP pd_canary_ejected 1 while the canary holds this instance out of every router\'s rotation.',
                  '# TYPE pd_canary_ejected gauge']
        lines += ['pd_canary_ejected{pool="%s",instance="%s"} %d' % (_esc(pool), _esc(n), n in (ejected.get('out') or {}))
                  for n in members]
        lines += ['# HELP pd_canary_ejections_total Times the canary took this instance out of rotation.',
                  '# TYPE pd_canary_ejections_total counter']
        lines += ['pd_canary_ejections_total{pool="%s",instance="%s"} %d' % (_esc(pool), _esc(n), c)
                  for n, c in sorted((ejected.get('count') or {}).items())]
    if fabric is not None:
        lines += ['# HELP pd_canary_fabric_broken 1 when every pair of the pool failed its last canaries (no restart is tried).',
                  '# TYPE pd_canary_fabric_broken gauge',
                  'pd_canary_fabric_broken{pool="%s"} %d' % (_esc(pool), fabric)]
    lines += ['# HELP pd_canary_last_run_timestamp_seconds When this canary last finished a run.',
              '# TYPE pd_canary_last_run_timestamp_seconds gauge',
              'pd_canary_last_run_timestamp_seconds{pool="%s"} %d' % (_esc(pool), now)]
    return '\n'.join(lines) + '\n'


def write_atomic(path, text, mode=0o644):
    tmp = '%s.%d.tmp' % (path, os.getpid())
    with open(tmp, 'w') as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class Client:
    """HTTP to the instances (stdlib: the tool runs on the host's own python3)."""

    def __init__(self, key, timeout):
        self.key, self.timeout = key, timeout

    def _open(self, url, body=None, timeout=None):
        headers = {'Content-Type': 'application/json'}
        if self.key:
            headers['Authorization'] = 'Bearer ' + self.key
        req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                return resp.status, resp.read().decode(errors='replace')
        except urllib.error.HTTPError as e:
            try:
                return e.code, e.read(200).decode(errors='replace')
            except OSError:
                return e.code, ''
        except (OSError, ValueError) as e:  # refused, reset, timed out
            return type(e).__name__, ''

    def get(self, url, timeout=None):
        return self._open(url, timeout=timeout)

    def post(self, url, body):
        return self._open(url, body)

    def post_empty(self, url):
        """A POST without a body (the heal request)."""
        return self._open(url, {})


def probe(client, pair, model, quick=3.0):
    """One canary through pair: {result, reason, seconds, tokens}."""
    health = {}
    for end in ('prefill', 'decode'):
        status, text = client.get(pair[end + '_url'] + '/health', timeout=quick)
        # An instance the ejector took out of rotation still serves (and must be probed to come back).
        health[end] = status == 200 or (status == 503 and text.strip() == EJECTED)
    out = {'seconds': 0.0, 'tokens': 0, 'unhealthy': [pair[end] for end, ok in sorted(health.items()) if not ok]}
    if not all(health.values()):
        out['result'], out['reason'] = verdict(health, {}, 0, 0)
        return out
    status, text = client.get(pair['bootstrap_url'] + '/query', timeout=quick)
    try:
        engine = engine_id(json.loads(text)) if status == 200 else None
    except ValueError:
        engine = None
    if not engine:
        out['result'], out['reason'] = 'fail', 'prefill bootstrap %s/query answered %s' % (pair['bootstrap_url'], status)
        return out
    status, text = client.get(pair['decode_url'] + '/metrics', timeout=quick)
    before = transfer_tokens(text) if status == 200 else None
    pre, dec = requests_for(pair, model, engine, 'canary-' + uuid.uuid4().hex, prompt())
    answers = {}

    def send(end, body):
        answers[end] = client.post(pair[end + '_url'] + '/v1/completions', body)[0]

    start, out['at'] = time.monotonic(), round(time.time(), 3)
    threads = [threading.Thread(target=send, args=a, daemon=True) for a in (('prefill', pre), ('decode', dec))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(client.timeout + 1)
    out['seconds'] = time.monotonic() - start
    for end in ('prefill', 'decode'):
        answers.setdefault(end, 'timeout')
    status, text = client.get(pair['decode_url'] + '/metrics', timeout=quick)
    after = transfer_tokens(text) if status == 200 else None
    out['tokens'] = max(int((after or 0) - (before or 0)), 0)
    out['result'], out['reason'] = verdict(health, answers, before, after)
    return out


def run(config, client, history, log=print, confirm=0, after_pair=None):
    """Every pair once: the pairs of one decode in turn (its counter is read around each), decodes side by side. A
    pair that fails is probed again at once, up to CONFIRM more times while it fails; each probe counts in the
    history. AFTER_PAIR(pair, outcomes so far) runs after each pair's probes, one at a time (the ejector: a broken
    path leaves the rotation while the run goes on)."""
    by_decode = {}
    for pair in config['pairs']:
        by_decode.setdefault(pair['decode'], []).append(pair)
    outcomes = {}
    lock = threading.Lock()

    def walk(pairs):
        for pair in pairs:
            tries = [probe(client, pair, config['model'])]
            while tries[-1]['result'] == 'fail' and len(tries) <= confirm:
                tries.append(probe(client, pair, config['model']))
            o = dict(tries[-1], seconds=sum(t['seconds'] for t in tries), probes=len(tries))
            with lock:
                for t in tries:
                    history.add(pair, t['result'])
                outcomes[History.key(pair)] = o
                log('canary pool=%s %s -> %s: %s in %.2fs (%s; %d failed in a row)' % (
                    config['pool'], pair['prefill'], pair['decode'], o['result'], o['seconds'], o['reason'],
                    history.failures(pair)))
                if after_pair:
                    after_pair(pair, [(p, outcomes[History.key(p)]) for p in config['pairs']
                                      if History.key(p) in outcomes])

    threads = [threading.Thread(target=walk, args=(pairs,), daemon=True) for pairs in by_decode.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [(pair, outcomes[History.key(pair)]) for pair in config['pairs']]


def abort_call(client, reason_prefix='pd-canary'):
    """(decode_url, since, bootstrap_url, why) -> (ok, detail): POST /pd-bundle/abort on the decode."""
    def call(url, since, bootstrap, why):
        query = urllib.parse.urlencode({'since': '%.3f' % since, 'remote': bootstrap,
                                        'reason': '%s: %s' % (reason_prefix, why)})
        status, text = client.post_empty('%s/pd-bundle/abort?%s' % (url, query))
        return status == 200, 'answered %s %s' % (status, text.strip())
    return call


def eject_call(client, reason_prefix='pd-canary'):
    """(url, ttl, why) -> (ok, detail): POST /pd-bundle/eject on the instance (ttl 0: back in rotation)."""
    def call(url, ttl, why):
        query = urllib.parse.urlencode({'ttl': int(ttl), 'reason': '%s: %s' % (reason_prefix, why)})
        status, _ = client.post_empty('%s/pd-bundle/eject?%s' % (url, query))
        return status == 200, 'answered %s' % status
    return call


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--config', required=True, help='the pairs (JSON: pool, model, timeout_s, pairs, textfile, state)')
    a = ap.parse_args(argv)
    with open(a.config) as f:
        config = json.load(f)
    state = config.get('state') or ''
    saved = {}
    if state and os.path.exists(state):
        try:
            with open(state) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            saved = {}
    data = saved.get('history') or {}
    history = History(data, keep=max(int(config.get('keep', 10)), 1))
    client = Client(os.environ.get(KEY_ENV, ''), float(config['timeout_s']))
    started = time.time()
    eject_cfg = config.get('eject') or {}
    ejector = Ejector(eject_cfg, saved.get('ejected'), int(started)) if eject_cfg.get('enabled') else None
    after_pair, call = None, None
    if ejector:
        call = eject_call(client)

        abort = abort_call(client)

        def after_pair(pair, so_far):
            ejector.note(pair, next(o for p, o in so_far if p is pair))
            down = {n for _, o in so_far for n in o.get('unhealthy') or []}
            ejector.step(config['pairs'], history, down, call,
                         log=lambda line: print('canary pool=%s %s' % (config['pool'], line), flush=True), abort=abort)
    outcomes = run(config, client, history, confirm=int(eject_cfg.get('confirm', 0)) if ejector else 0,
                   after_pair=after_pair)
    if ejector:
        ejector.finish(config['pairs'], outcomes, call,
                       log=lambda line: print('canary pool=%s %s' % (config['pool'], line), flush=True),
                       abort=abort, history=history)
    now = int(time.time())
    failures = int(config['failures'])
    heal_cfg = config.get('heal') or {}
    healer = Healer(heal_cfg, saved.get('heals'), now) if heal_cfg else None
    fabric = None
    if healer:
        action, target, why = healer.decide(config['pairs'], outcomes, history, failures)
        fabric = int(action == 'fabric')
        if action != 'none':
            print('canary pool=%s heal: %s %s: %s' % (config['pool'], action, target or '-', why), flush=True)
        if action == 'heal':
            url = heal_url(config['pairs'], target)
            query = urllib.parse.urlencode({'reason': 'pd-canary: ' + why, 'grace': heal_cfg.get('grace_s', 5)})
            status, _ = client.post_empty('%s/pd-bundle/heal?%s' % (url, query))
            healer.record(target)
            print('canary pool=%s heal: asked %s (%s) to drain and restart: %s' % (config['pool'], target, url, status),
                  flush=True)
    if state:
        write_atomic(state, json.dumps({'time': now, 'started': round(started, 3), 'pool': config['pool'], 'failures': failures,
                                        'history': history.data, 'heals': healer.state if healer else {},
                                        'ejected': ejector.state if ejector else {},
                                        'last': {History.key(p): o for p, o in outcomes}}, sort_keys=True), 0o644)
    if config.get('textfile'):
        try:
            write_atomic(config['textfile'], metrics(config['pool'], outcomes, history, now, failures,
                                                     healer.state if healer else None, fabric,
                                                     ejector.state if ejector else None))
        except OSError as e:  # the collector's directory is gone: the state file still has the results
            print('cannot write %s: %s' % (config['textfile'], e), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
