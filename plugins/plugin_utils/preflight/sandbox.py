"""Preflight checks of the class sandbox: paths the hardened units hide or make read-only.

Unit-tested in tests/unit/test_preflight_checks.py and tests/unit/test_preflight_classes.py.
"""
import os
import re

from ansible_collections.pd_bundle.serving.plugins.filter import target_rules as _rules

from .core import _model_src_problem, _roles, _setting, check, refuse


# --- unit sandboxes: paths the hardened units hide or make read-only ----------------------------------------

_SANDBOX_CACHE = {}


def sandbox_directives(macro=None):
    """{directive: value} of ProtectSystem/ProtectHome/PrivateTmp in the sandbox macro every unit imports
    (templates/common/hardening.j2; unconditional lines: every unit gets them)."""
    macro = macro or os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', 'templates', 'common',
                                  'hardening.j2')
    if macro not in _SANDBOX_CACHE:
        with open(macro) as fh:
            text = fh.read()
        _SANDBOX_CACHE[macro] = dict(re.findall(r'^(ProtectSystem|ProtectHome|PrivateTmp)=(\S+)$', text, re.M))
    return _SANDBOX_CACHE[macro]


def _sandbox(directives=None):
    """{'hidden': [...], 'private': [...], 'read_only': [...]} of the macro's directives."""
    out = {'hidden': [], 'private': [], 'read_only': []}
    for key, value in (directives or sandbox_directives()).items():
        for kind, paths in _rules.SANDBOX_EFFECTS.get((key, value), {}).items():
            out[kind] += paths
    return out


def _unit_paths(cfg, unit):
    """(writable paths, [(var, path, need)]) of a unit on a host: need is read or write."""
    spec = _rules.UNIT_PATHS[unit]
    writable = [str(_setting(cfg, w)) if not w.startswith('/') else w for w in spec['writable']]
    model = _setting(cfg, 'vllm_model')
    hub = isinstance(model, str) and bool(model) and not model.startswith('/')
    wanted = dict([(v, 'read') for v in spec['read']] + [(v, 'write') for v in spec['write']]
                  + [(v, 'write') for v in spec['write_if_hub'] if hub])
    paths = []
    for var, need in wanted.items():
        value = _setting(cfg, var)
        if isinstance(value, str) and value.startswith('/'):
            paths.append((var, value, need))
    return [w for w in writable if w.startswith('/')], paths


def _sandbox_findings(cfg, host, groups):
    """[(unit, var, path, kind, where)] of every path a unit of the host cannot use as it needs."""
    r, box = _roles(host, groups), _sandbox()
    out = []
    for unit, spec in _rules.UNIT_PATHS.items():
        if not r.get(spec['role']):
            continue
        writable, paths = _unit_paths(cfg, unit)
        for var, path, need in paths:
            hit = next((('hidden', p) for p in box['hidden'] if _rules.under(path, p)), None) or \
                next((('private', p) for p in box['private'] if _rules.under(path, p)), None)
            if hit is None and need == 'write' and any(_rules.under(path, p) for p in box['read_only']) \
                    and not any(_rules.under(path, w) for w in writable + _rules.SANDBOX_API_FS):
                hit = ('read_only', next(p for p in box['read_only'] if _rules.under(path, p)))
            if hit:
                out.append((unit, var, path, hit[0], hit[1], writable))
    return out


_SANDBOX_WHY = {
    'hidden': 'which the unit\'s sandbox hides (%s: the service does not see %s at all)',
    'private': 'inside the unit\'s private %s (%s: the service sees an empty directory of its own, removed at stop)',
    'read_only': 'read-only for the unit (%s makes %s read-only outside the unit\'s writable paths)',
}


def _sandbox_directive_of(kind, prefix):
    for (key, value), effects in _rules.SANDBOX_EFFECTS.items():
        if sandbox_directives().get(key) == value and prefix in effects.get(kind, []):
            return '%s=%s' % (key, value)
    return 'the sandbox'


@check('sandbox')
def sandbox_hidden(cfg, host, groups, specs):
    """A model path, HF home or data dir that the unit's sandbox hides or replaces (ProtectHome, PrivateTmp)."""
    return [refuse(var, host, 'is under %s, %s: %s %s'
                   % (prefix, _SANDBOX_WHY[kind] % ((prefix, _sandbox_directive_of(kind, prefix)) if kind == 'private'
                                                    else (_sandbox_directive_of(kind, prefix), prefix)),
                      unit, 'fails at start' if kind == 'hidden' else 'never sees what the host has there, and what '
                                                                      'it writes there is lost at every stop'),
                   'move it out of %s, e.g. below /srv or /var/lib.' % prefix, value=path)
            for unit, var, path, kind, prefix, _ in _sandbox_findings(cfg, host, groups) if kind != 'read_only']


@check('sandbox')
def sandbox_read_only(cfg, host, groups, specs):
    """A path a unit writes (HF home for a hub model, data dir) outside the unit's writable paths."""
    return [refuse(var, host, 'is %s; %s writes there' % (_SANDBOX_WHY[kind] % (_sandbox_directive_of(kind, prefix),
                                                                                prefix), unit),
                   'put it below %s.' % (' or '.join(writable) or 'a writable path of the unit'), value=path)
            for unit, var, path, kind, prefix, writable in _sandbox_findings(cfg, host, groups) if kind == 'read_only']


@check('sandbox', role='vllm')
def sandbox_pool_models(cfg, host, groups, specs):
    """The models of the pools this host serves in (vllm_pools[].model, model_src): the same checks as vllm_model
    and vllm_model_src get (a path the vLLM unit's sandbox hides or replaces; a model_src that is no controller
    directory, or whose destination is no absolute path), named as the pool's settings."""
    out = []
    for i, pool in enumerate(cfg.get('vllm_pools') or []):
        if not isinstance(pool, dict) or not any(str(ref).partition('/')[0] == str(host)
                                                 for role in ('prefill', 'decode') for ref in pool.get(role) or []):
            continue
        model, src = pool.get('model'), pool.get('model_src')
        var = 'vllm_pools[%d]' % i
        for unit, v, path, kind, prefix, _ in _sandbox_findings(dict(cfg, vllm_model=model), host, groups):
            if v == 'vllm_model' and kind != 'read_only':
                out.append(refuse(var + '.model', host, 'is under %s, which the %s unit\'s sandbox %s: it fails at '
                                  'start' % (prefix, unit, 'hides' if kind == 'hidden' else 'replaces'),
                                  'move the model out of %s, e.g. below /srv.' % prefix, value=path))
        problem = _model_src_problem(src, model)
        if problem == 'src':
            out.append(refuse(var + '.model_src', host, 'is not a directory on the controller (the machine running '
                              'ansible-playbook)', 'point it at the model directory on the controller, or set it to '
                              '"" when the model is already on the hosts.', value=src))
        elif problem == 'model':
            out.append(refuse(var + '.model', host, 'must be an absolute path on the host: it is where model_src is '
                              'copied to', 'set the absolute destination (e.g. /srv/models/NAME).', value=model))
    return out
