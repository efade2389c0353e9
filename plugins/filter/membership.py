"""A router's worker list against the inventory (issue 32): what to remove live, what needs a restart, and what
status reports.

vllm-router 0.1.17 in PD mode (measured on the lab, docs/scaling.md):
- removes a worker live: `POST /remove_worker?url=URL` (200, the worker leaves /workers, the process stays);
- refuses a live add: `POST /add_worker` and `POST /workers` answer 400 "PD router requires specific
  add_prefill_server or add_decode_server methods", and no HTTP route reaches those methods;
- with --enable-igw it takes workers through `POST /workers`, but then ignores its command-line workers, and a prefill
  added that way gets no Mooncake bootstrap lookup ("No Mooncake bootstrap info for prefill ..., decode will proceed
  without kv_transfer_params"): decode would recompute every prompt.
So an instance that joins reaches a router only through a restart with the new command line (LIVE_ADD False); one that
leaves is removed live. The upstream change that would make adds live: an HTTP route to VllmPDRouter's
add_prefill_server / add_decode_server that runs query_mooncake_bootstrap for a new prefill.

- router_flags:       a router's argv without its worker list (--prefill URL [PORT], --decode URL): what restarts it.
- router_workers:     a router's argv's worker list, as vllm-router's POST /workers bodies (scripts/lab/pools-test.py).
- router_env_argv:    the command line of a router env file's VLLM_ROUTER_ARGS line.
- router_env_flags:   router_flags of a router env file's VLLM_ROUTER_ARGS line.
- router_membership:  a router's /workers answer against the wanted prefills and decodes: remove (live), add (restart),
  unhealthy, and in_sync.
- vllm_env_endpoint:  {url, prefill} of an instance from its env file (retiring one the inventory no longer has).
- bootstrap_query_url: a prefill's Mooncake bootstrap /query URL (a joining prefill must answer it first).
- membership_problems: one line per difference, for status (red) and the converge's read-back.
"""

LIVE_ADD = False  # vllm-router 0.1.17: no live add in PD mode (see above)
WORKER_FLAGS = {'--prefill': 'prefill', '--decode': 'decode'}


def _split_argv(argv):
    """(flags, workers) of a router argv: the argv without its --prefill URL [BOOTSTRAP_PORT] and --decode URL entries
    (a port is the token after a prefill's URL when it is all digits), and those entries as
    [{url, worker_type, bootstrap_port (a prefill's, when given)}] in argv order."""
    flags, workers, i, argv = [], [], 0, [str(a) for a in (argv or [])]
    while i < len(argv):
        if argv[i] in WORKER_FLAGS:
            w = {'url': argv[i + 1] if i + 1 < len(argv) else None, 'worker_type': WORKER_FLAGS[argv[i]]}
            i += 2
            if w['worker_type'] == 'prefill' and i < len(argv) and argv[i].isdigit():
                w['bootstrap_port'] = int(argv[i])
                i += 1
            if w['url'] is not None:
                workers.append(w)
            continue
        flags.append(argv[i])
        i += 1
    return flags, workers


def router_flags(argv):
    """argv without its --prefill URL [BOOTSTRAP_PORT] and --decode URL entries: what restarts the router."""
    return _split_argv(argv)[0]


def router_workers(argv):
    """[{url, worker_type, bootstrap_port?}] of a router argv's --prefill URL [PORT] and --decode URL entries (in
    the shape of vllm-router's POST /workers body)."""
    return _split_argv(argv)[1]


def router_env_argv(env_text, name='VLLM_ROUTER_ARGS'):
    """The command line in a router env file's NAME="..." line, split as systemd splits $VAR (None: no such line)."""
    for line in str(env_text or '').splitlines():
        if line.startswith(name + '='):
            return line[len(name) + 1:].strip().strip('"').split()
    return None


def router_env_flags(env_text, name='VLLM_ROUTER_ARGS'):
    """router_flags of the command line in a router env file's NAME="..." line (None: the file has no such line)."""
    argv = router_env_argv(env_text, name)
    return None if argv is None else router_flags(argv)


def vllm_env_endpoint(env_text):
    """{url, prefill} of a vLLM instance from its env file (/etc/vllm/<name>.env): the URL the routers know it by
    (http://VLLM_HOST_IP:SERVE_PORT, as bundle_vllm_endpoints builds it) and whether it is a prefill (it has a Mooncake
    bootstrap port). For an instance the inventory no longer has."""
    env = {}
    for line in str(env_text or '').splitlines():
        if '=' in line and not line.lstrip().startswith('#'):
            k, v = line.split('=', 1)
            env[k.strip()] = v.strip().strip('"').strip("'")
    return {'url': 'http://%s:%s' % (env.get('VLLM_HOST_IP') or env.get('SERVE_BIND_HOST'), env.get('SERVE_PORT')),
            'prefill': 'VLLM_MOONCAKE_BOOTSTRAP_PORT' in env}


def bootstrap_query_url(prefill):
    """The Mooncake bootstrap /query URL of a prefill ({url, bootstrap_port}): what the router asks at its start."""
    host = str(prefill['url']).split('://', 1)[-1].rsplit(':', 1)[0]
    return 'http://%s:%s/query' % (host, prefill['bootstrap_port'])


def _want(prefills, decodes):
    want = {}
    for p in prefills or []:
        p = p if isinstance(p, dict) else {'url': p}
        want[str(p['url']).rstrip('/')] = {'type': 'prefill', 'bootstrap_port': p.get('bootstrap_port')}
    for d in decodes or []:
        url = d['url'] if isinstance(d, dict) else d
        want[str(url).rstrip('/')] = {'type': 'decode', 'bootstrap_port': None}
    return want


def router_membership(workers, prefills, decodes, bootstrap=True):
    """workers: the router's GET /workers answer (its 'workers' list, or the whole answer); prefills: [{url,
    bootstrap_port}] (or urls); decodes: [url] (or [{url}]); bootstrap: the router looks up prefills' bootstrap ports
    (the mooncake connector). Returns {remove: [url], add: [{url, type, bootstrap_port}], unhealthy: [url],
    in_sync: bool, restart: bool (an add needs one: LIVE_ADD)}. A worker of the wrong type or bootstrap port is both
    removed and added."""
    if isinstance(workers, dict):
        workers = workers.get('workers') or []
    have = {}
    for w in workers or []:
        have[str(w.get('url', '')).rstrip('/')] = w
    want = _want(prefills, decodes)
    remove, add = [], []
    for url, w in have.items():
        t = want.get(url)
        if t is None or t['type'] != w.get('worker_type') or (
                bootstrap and t['type'] == 'prefill' and t['bootstrap_port'] is not None
                and w.get('bootstrap_port') is not None and str(w.get('bootstrap_port')) != str(t['bootstrap_port'])):
            remove.append(url)
    for url, t in want.items():
        if url not in have or url in remove:
            add.append({'url': url, 'type': t['type'], 'bootstrap_port': t['bootstrap_port']})
    unhealthy = [u for u, w in have.items() if u in want and u not in remove and not w.get('is_healthy', True)]
    return {'remove': sorted(remove), 'add': add, 'unhealthy': sorted(unhealthy),
            'in_sync': not remove and not add, 'restart': bool(add) and not LIVE_ADD}


def membership_problems(plan, router=''):
    """Text lines, one per difference of a router_membership plan (empty when the router matches the inventory)."""
    who = '%s: ' % router if router else ''
    out = ['%srouter has %s, which the inventory does not serve' % (who, u) for u in plan.get('remove') or []]
    out += ['%srouter lacks %s %s from the inventory' % (who, a['type'], a['url']) for a in plan.get('add') or []]
    return out


class FilterModule(object):
    def filters(self):
        return {
            'bundle_router_flags': router_flags,
            'bundle_router_env_flags': router_env_flags,
            'bundle_vllm_env_endpoint': vllm_env_endpoint,
            'bundle_bootstrap_query_url': bootstrap_query_url,
            'bundle_router_membership': router_membership,
            'bundle_membership_problems': membership_problems,
        }
