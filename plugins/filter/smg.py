"""smg (the Shepherd Model Gateway, PyPI `smg`) as the router (issue 52): its command line, its worker manifest and
its worker list against the inventory.

Why smg: vllm-router 0.1.17 takes no prefill or decode live in PD mode (plugins/filter/membership.py), so every join
restarts every router of the pool. smg 1.13.0 reads its workers from a file-discovery manifest and re-reads it when it
changes: an instance joins or leaves when Ansible rewrites the file (atomically), with no restart (../shared/FACTS.md,
checked on the lab).

What registration needs (FACTS): every worker carries `kv_connector` (MooncakeConnector), and a prefill its
`kv_engine_id` (the engine id vLLM's bootstrap server names, pinned by the bundle: `<host>-<instance>`, or the
instance's `engine_id`) and its `bootstrap_port`. A worker without them is routed through smg's passthrough mode:
decode recomputes every prompt, with only a WARN line (alert PDRouterPassthrough).

- smg_argv:        smg's argv after `smg launch` (never the key: pd_bundle_smg_launch.py adds it in process).
- smg_manifest:    the file-discovery manifest {version: 1, workers: [...]} of a router's workers.
- smg_membership:  smg's GET /workers answer against the manifest: missing, unready, extra, in_sync.
- POLICIES:        the policies each implementation has (preflight refuses the others).

Store mode (MooncakeStoreConnector, vllm-router's sequential nixl mode) on smg is not built: preflight refuses it.
"""
from ansible_collections.pd_bundle.serving.plugins.filter import bundle as _bundle

# The router implementations the role runs (vllm_router_implementation) and the policies each one has: vllm-router
# 0.1.17's --help, smg 1.13.0's --help (prefill also has bucket). The argument spec offers their union.
POLICIES = {
    'vllm-router': {'prefill': ('random', 'round_robin', 'cache_aware', 'power_of_two', 'consistent_hash'),
                    'decode': ('random', 'round_robin', 'cache_aware', 'power_of_two', 'consistent_hash')},
    'smg': {'prefill': ('random', 'round_robin', 'cache_aware', 'power_of_two', 'least_load', 'consistent_hashing',
                        'prefix_hash', 'bucket'),
            'decode': ('random', 'round_robin', 'cache_aware', 'power_of_two', 'least_load', 'consistent_hashing',
                       'prefix_hash')},
}
IMPLEMENTATIONS = tuple(sorted(POLICIES))
# The KV connector each worker is registered with (smg's manifest field kv_connector), by the router's PD mode.
KV_CONNECTORS = {'mooncake': 'MooncakeConnector'}
# The fields smg 1.13.0's file manifest accepts; any other field makes it ignore the whole manifest (FACTS).
MANIFEST_FIELDS = ('id', 'url', 'worker_type', 'bootstrap_port', 'model_id', 'kv_connector', 'kv_role',
                   'kv_engine_id')


def smg_argv(cfg):
    """smg's argv after `smg launch`: its discovery flags, then the flags it shares with vllm-router
    (bundle.router_common_flags). cfg: the router role's settings without the vllm_router_ prefix (as
    bundle_router_argv takes them) plus manifest (the discovery file's path), discovery_interval_secs and
    shutdown_grace_secs. No worker is on it (they come from the manifest), so a join or a leave never changes it."""
    a = ['--pd-disaggregation', '--discovery-provider', 'file', '--discovery-file', str(cfg['manifest']),
         '--discovery-check-interval-secs', str(cfg['discovery_interval_secs']),
         '--shutdown-grace-period-secs', str(cfg['shutdown_grace_secs']),
         # A drained or restarting instance stays listed (not ready) and returns after its health checks pass, as on
         # vllm-router; smg's default under discovery removes it and re-registers it later (seen: ~30 s).
         '--no-remove-unhealthy-workers']
    return a + _bundle.router_common_flags(cfg)


def _url(u):
    return str(u).rstrip('/')


def _worker_id(url):
    """A worker's manifest id: its address (stable across runs, unique per router)."""
    return _url(url).split('://', 1)[-1].replace(':', '-')


def smg_manifest(prefills, decodes, kv_connector='mooncake'):
    """The file-discovery manifest of a router's workers. prefills: [{url, bootstrap_port, engine_id}] (the
    router's prefill list, bundle_vllm_endpoints); decodes: [url] or [{url}]. Workers are sorted by URL so the file
    only changes when membership does."""
    connector = KV_CONNECTORS.get(str(kv_connector))
    if connector is None:
        raise ValueError('smg_manifest: the router PD mode %r is not built for smg (only %s)'
                         % (kv_connector, ', '.join(sorted(KV_CONNECTORS))))
    workers = []
    for p in prefills or []:
        p = p if isinstance(p, dict) else {'url': p}
        if not p.get('engine_id') or not p.get('bootstrap_port'):
            raise ValueError('smg_manifest: prefill %s has no engine_id or bootstrap_port: smg would route it through '
                             'passthrough (decode recomputes every prompt)' % p.get('url'))
        workers.append({'id': _worker_id(p['url']), 'url': _url(p['url']), 'worker_type': 'prefill',
                        'bootstrap_port': int(p['bootstrap_port']), 'kv_connector': connector,
                        'kv_engine_id': str(p['engine_id'])})
    for d in decodes or []:
        url = d['url'] if isinstance(d, dict) else d
        workers.append({'id': _worker_id(url), 'url': _url(url), 'worker_type': 'decode', 'kv_connector': connector})
    return {'version': 1, 'workers': sorted(workers, key=lambda w: (w['worker_type'], w['url']))}


def _listed(answer):
    if isinstance(answer, dict):
        answer = answer.get('workers') or []
    return [w for w in answer or [] if isinstance(w, dict)]


def _ready(w):
    """Whether smg routes to a listed worker: is_healthy and status "ready" (smg 1.13.0's GET /workers; seen:
    "ready", "not_ready", "pending")."""
    return bool(w.get('is_healthy')) and str(w.get('status') or '').lower() == 'ready'


def smg_membership(answer, manifest):
    """smg's GET /workers answer against the manifest the bundle wrote. Returns {missing: [url] (in the manifest,
    not listed), extra: [url] (listed, not in the manifest), unready: [url] (listed, not ready), wrong: [url]
    (listed with another type or engine id), in_sync: bool (nothing missing, extra or wrong), ready: bool (in_sync
    and every worker ready)}."""
    want = {w['url']: w for w in (manifest or {}).get('workers') or []}
    have = {_url(w.get('url', '')): w for w in _listed(answer)}
    missing = sorted(u for u in want if u not in have)
    extra = sorted(u for u in have if u not in want)
    wrong = sorted(u for u, w in have.items() if u in want and (
        str(w.get('worker_type', want[u]['worker_type'])).lower() != want[u]['worker_type']
        or (want[u].get('kv_engine_id') and w.get('kv_engine_id')
            and str(w['kv_engine_id']) != want[u]['kv_engine_id'])))
    unready = sorted(u for u, w in have.items() if u in want and not _ready(w))
    in_sync = not missing and not extra and not wrong
    return {'missing': missing, 'extra': extra, 'wrong': wrong, 'unready': unready, 'in_sync': in_sync,
            'ready': in_sync and not unready}


def smg_membership_problems(plan, router=''):
    """Text lines, one per difference of an smg_membership plan (empty when the router matches its manifest)."""
    who = '%s: ' % router if router else ''
    return (['%ssmg lacks %s from its manifest' % (who, u) for u in plan.get('missing') or []]
            + ['%ssmg has %s, which its manifest does not list' % (who, u) for u in plan.get('extra') or []]
            + ['%ssmg has %s with another type or engine id than its manifest' % (who, u)
               for u in plan.get('wrong') or []])


class FilterModule(object):
    def filters(self):
        return {
            'bundle_smg_argv': smg_argv,
            'bundle_smg_manifest': smg_manifest,
            'bundle_smg_membership': smg_membership,
            'bundle_smg_membership_problems': smg_membership_problems,
        }
