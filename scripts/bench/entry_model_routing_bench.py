#!/usr/bin/env python3
"""What routing by model costs in the entry: the same small requests through two HAProxys rendered from
templates/entry/haproxy.cfg.j2 on loopback, one with model pools (the body buffered and read, json_query, the maps,
the key's access) and one without (one backend, no body read), both in front of the same stand-in router (the unit
test's, tests/unit/test_entry_haproxy.py). The requests alternate between the two, one in flight, each HAProxy on
its own kept-alive TLS connection, so both see the same machine at the same moments.

Prints one JSON document: p50/p99/mean latency (ms) of each and the p50 ratio routed/plain. Reported, not asserted.
Runs where haproxy is installed (a laptop with scripts/install-deps.sh, or an entry host of the lab: loopback only):

  python3 scripts/bench/entry_model_routing_bench.py [--requests 300] [--prompt-bytes 200]
"""
import argparse
import http.client
import importlib.util
import json
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def harness():
    spec = importlib.util.spec_from_file_location('entry_harness', REPO / 'tests' / 'unit' / 'test_entry_haproxy.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def start(h, tmp, router, pools):
    tmp.mkdir()
    h.make_cert(tmp)
    port = h.free_port()
    backends = [{'host': 'router-1', 'address': '127.0.0.1', 'port': router.server_port}]
    cfg = tmp / 'haproxy.cfg'
    cfg.write_text(h.not_root(h.render(tmp, backends, pools=pools, entry_keys=h.POOL_KEYS, entry_port=port,
                                       entry_bind_address='127.0.0.1', entry_check_port=h.free_port(),
                                       **({'entry_key_models': {'ci': ['chat']}} if pools else {}))))
    proc = subprocess.Popen([h.HAPROXY, '-W', '-db', '-f', str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 15
    while True:
        try:
            if h.request(port, tmp, '/healthz')[0] == 200:
                return proc, port
        except OSError:
            pass
        if time.time() > deadline:
            raise SystemExit('haproxy did not start (%s)' % cfg)
        time.sleep(0.2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--requests', type=int, default=300)
    ap.add_argument('--prompt-bytes', type=int, default=200)
    args = ap.parse_args()
    h = harness()
    if h.HAPROXY is None:
        raise SystemExit('haproxy is not installed (scripts/install-deps.sh)')
    router = h.stand_in('a')
    procs = []
    with tempfile.TemporaryDirectory() as d:
        try:
            plain = start(h, Path(d) / 'plain', router, ())
            procs.append(plain[0])
            routed = start(h, Path(d) / 'routed', router, h.two_pools(router, router))
            procs.append(routed[0])
            conns, times = {}, {'plain': [], 'routed': []}
            for name, (_, port) in (('plain', plain), ('routed', routed)):
                ctx = ssl.create_default_context(cafile=str(Path(d) / name / 'cert.pem'))
                conns[name] = http.client.HTTPSConnection('127.0.0.1', port, context=ctx, timeout=20)
            body = json.dumps({'model': 'model-a', 'prompt': 'x' * args.prompt_bytes, 'max_tokens': 1}).encode()
            headers = {'Authorization': 'Bearer ' + h.POOL_KEYS['alice'], 'Content-Type': 'application/json'}
            for i in range(args.requests + 10):  # the first 10 rounds warm up and are not counted
                order = ('plain', 'routed') if i % 2 == 0 else ('routed', 'plain')
                for name in order:
                    t0 = time.perf_counter()
                    conns[name].request('POST', '/v1/completions', body=body, headers=headers)
                    resp = conns[name].getresponse()
                    resp.read()
                    dt = (time.perf_counter() - t0) * 1000
                    if resp.status != 200:
                        raise SystemExit('%s: HTTP %d' % (name, resp.status))
                    if i >= 10:
                        times[name].append(dt)
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
                p.wait(10)
            router.shutdown()

    def stats(xs):
        xs = sorted(xs)
        return {'p50_ms': round(statistics.median(xs), 3), 'p99_ms': round(xs[int(len(xs) * 0.99) - 1], 3),
                'mean_ms': round(statistics.mean(xs), 3), 'n': len(xs)}
    out = {'plain': stats(times['plain']), 'routed': stats(times['routed'])}
    out['p50_ratio_routed_over_plain'] = round(out['routed']['p50_ms'] / out['plain']['p50_ms'], 3)
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == '__main__':
    main()
