"""The prefill:decode ratio advisor (issue 32): from what Prometheus saw over a window and the SLO targets, how many
prefill and decode instances the traffic needs, and the inventory change that gets there. It advises; the operator
converges (playbooks/advisor.yml prints it; nothing here acts).

Two ways to size each pool, the first that applies:
1. A capacity curve from the benchmark (a sweep), as NVIDIA Dynamo's planner does:
   - prefill: points {prompt_tokens, ttft_p99_s, tokens_per_s} of one instance; the instance's capacity is the best
     tokens_per_s among points within the TTFT target at the traffic's prompt length (the nearest swept length at or
     above it). Needed = ceil(request rate x prompt tokens / capacity).
   - decode: points {concurrency, itl_p99_s} of one instance; its capacity is the highest concurrency within the ITL
     target. The traffic's concurrency is Little's law: request rate x output tokens x ITL (at the target).
     Needed = ceil(concurrency / capacity).
2. No sweep: the observed operating point.
   - prefill, a queue (M/M/1): with service time S (TTFT p99 minus queue time p99) and queue time Q, the utilisation
     is rho = Q / (Q + S), and the TTFT target T allows rho_max = 1 - S / T. Needed = ceil(now x rho / rho_max).
   - decode, a load factor: the worst of ITL p99 / target and KV use / kv_max (a pool near its KV cache limit
     queues however fast it steps). Needed = ceil(now x factor).
Each pool's answer says which way it was sized (basis) and why. Neither sizes a pool below 1.
"""
import math


def _f(v, default=None):
    try:
        out = float(v)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(out) or math.isinf(out) else out


def _ceil(x):
    return int(math.ceil(x - 1e-9))


def prefill_from_curve(curve, rate, prompt_tokens, ttft_target):
    """(instances, why) from a prefill sweep, or (None, why) when the sweep cannot answer."""
    pts = [p for p in curve or [] if _f(p.get('prompt_tokens')) and _f(p.get('tokens_per_s'))]
    if not pts:
        return None, 'no prefill sweep'
    lengths = sorted({_f(p['prompt_tokens']) for p in pts})
    at = next((n for n in lengths if n >= prompt_tokens), lengths[-1])
    ok = [_f(p['tokens_per_s']) for p in pts if _f(p['prompt_tokens']) == at and _f(p.get('ttft_p99_s'), 1e9) <= ttft_target]
    if not ok:
        return None, 'no swept point at %d prompt tokens meets TTFT p99 <= %.3g s' % (at, ttft_target)
    cap = max(ok)
    need = rate * prompt_tokens / cap
    return max(1, _ceil(need)), '%.1f req/s x %.0f prompt tokens / %.0f tokens/s per instance (sweep at %d tokens)' % (
        rate, prompt_tokens, cap, at)


def decode_from_curve(curve, rate, output_tokens, itl_target):
    pts = [p for p in curve or [] if _f(p.get('concurrency')) and _f(p.get('itl_p99_s')) is not None]
    if not pts:
        return None, 'no decode sweep'
    ok = [_f(p['concurrency']) for p in pts if _f(p['itl_p99_s']) <= itl_target]
    if not ok:
        return None, 'no swept concurrency meets ITL p99 <= %.3g s' % itl_target
    cap = max(ok)
    conc = rate * output_tokens * itl_target
    return max(1, _ceil(conc / cap)), '%.1f req/s x %.0f output tokens x %.3g s = %.1f streams / %d per instance (sweep)' % (
        rate, output_tokens, itl_target, conc, cap)


def prefill_from_queue(now, ttft_p99, queue_p99, ttft_target):
    if not now or ttft_p99 is None:
        return now or 1, 'no prefill traffic in the window: keep'
    q = max(0.0, queue_p99 or 0.0)
    s = max(ttft_p99 - q, 1e-6)
    if s >= ttft_target:
        return None, ('a request alone takes %.3g s (TTFT p99 %.3g s less queue %.3g s), over the %.3g s target: more '
                      'instances cannot help (a faster GPU, a shorter prompt or tensor parallelism can)' % (s, ttft_p99, q, ttft_target))
    rho = q / (q + s)
    rho_max = 1.0 - s / ttft_target
    return max(1, _ceil(now * rho / rho_max)), 'utilisation %.2f (queue %.3g s, service %.3g s), %.2f allowed by TTFT p99 <= %.3g s' % (
        rho, q, s, rho_max, ttft_target)


def decode_from_load(now, itl_p99, itl_target, kv_usage, kv_max):
    if not now or itl_p99 is None:
        return now or 1, 'no decode traffic in the window: keep'
    f_itl = itl_p99 / itl_target
    f_kv = (kv_usage or 0.0) / kv_max
    factor = max(f_itl, f_kv)
    which = 'ITL p99 %.3g s / target %.3g s' % (itl_p99, itl_target) if f_itl >= f_kv else 'KV use %.2f / %.2f' % (kv_usage, kv_max)
    return max(1, _ceil(now * factor)), 'load factor %.2f (%s)' % (factor, which)


def _sized(now, sweep, fallback_basis, fallback):
    """One pool: the sweep's answer (sweep: None where there is no traffic to size), else the fallback's, which says
    why the sweep gave none."""
    need, why = sweep() if sweep else (None, 'no traffic')
    if need is not None:
        return {'now': now, 'need': need, 'basis': 'sweep', 'why': why}
    need, fallback_why = fallback()
    return {'now': now, 'need': need, 'basis': fallback_basis, 'why': '%s (%s)' % (fallback_why, why)}


def ratio_advice(obs, targets, curves=None, now=None, spare_hosts=None, per_host=None):
    """obs: {rate (req/s), prompt_tokens, output_tokens (means per request), ttft_p99, prefill_queue_p99, itl_p99,
    decode_kv_usage (0..1, the pool's highest), running, waiting}; targets: {ttft_p99, itl_p99, kv_max (default
    0.9)}; curves: {prefill: [...], decode: [...]} (a benchmark sweep; either may be missing); now: {prefill: n,
    decode: n} instances; spare_hosts: the vllm_spare hosts; per_host: {prefill: n, decode: n} instances per host.
    Returns {prefill: {now, need, basis, why}, decode: {...}, changes: [text], ratio}."""
    curves, now, per_host = curves or {}, now or {}, per_host or {}
    ttft_t, itl_t = _f(targets.get('ttft_p99')), _f(targets.get('itl_p99'))
    kv_max = _f(targets.get('kv_max'), 0.9)
    rate = _f(obs.get('rate'), 0.0)
    out = {}
    out['prefill'] = _sized(
        now.get('prefill'),
        (lambda: prefill_from_curve(curves.get('prefill'), rate, _f(obs['prompt_tokens']), ttft_t))
        if rate > 0 and _f(obs.get('prompt_tokens')) else None,
        'queue',
        lambda: prefill_from_queue(now.get('prefill'), _f(obs.get('ttft_p99')), _f(obs.get('prefill_queue_p99')), ttft_t))
    out['decode'] = _sized(
        now.get('decode'),
        (lambda: decode_from_curve(curves.get('decode'), rate, _f(obs['output_tokens']), itl_t))
        if rate > 0 and _f(obs.get('output_tokens')) else None,
        'load',
        lambda: decode_from_load(now.get('decode'), _f(obs.get('itl_p99')), itl_t, _f(obs.get('decode_kv_usage')), kv_max))
    out['changes'] = inventory_changes(out, spare_hosts or [], per_host)
    p, d = out['prefill']['need'], out['decode']['need']
    out['ratio'] = '%s:%s' % (p if p is not None else '?', d if d is not None else '?')
    return out


def inventory_changes(advice, spare_hosts, per_host):
    """Text lines: the inventory change that gets each pool from now to need (hosts of vllm_spare first)."""
    lines, spares = [], list(spare_hosts)
    for pool in ('prefill', 'decode'):
        a = advice[pool]
        if a['need'] is None or a['now'] is None:
            lines.append('%s: no count advised (%s)' % (pool, a['why']))
            continue
        delta = a['need'] - a['now']
        if delta == 0:
            lines.append('%s: keep %d instance(s)' % (pool, a['now']))
            continue
        hosts = _ceil(abs(delta) / float(per_host.get(pool) or 1))
        if delta > 0:
            take, spares = spares[:hosts], spares[hosts:]
            moved = ('move %s from vllm_spare to vllm_%s' % (', '.join(take), pool)) if take else ''
            extra = hosts - len(take)
            add = ('add %d new host(s) to vllm_%s' % (extra, pool)) if extra > 0 else ''
            lines.append('%s: %d -> %d instance(s): %s' % (pool, a['now'], a['need'], '; '.join(x for x in (moved, add) if x)))
        else:
            lines.append('%s: %d -> %d instance(s): move %d host(s) from vllm_%s to vllm_spare' % (
                pool, a['now'], a['need'], hosts, pool))
    return lines


def prom_scalars(results):
    """{name: float or None} from the uri results of instant queries looped over dict2items (item.key, json): the
    first sample's value, None where the query returned nothing or NaN."""
    out = {}
    for r in results or []:
        data = ((r.get('json') or {}).get('data') or {}).get('result') or []
        out[r['item']['key']] = _f(data[0]['value'][1]) if data else None
    return out


class FilterModule(object):
    def filters(self):
        return {'bundle_ratio_advice': ratio_advice, 'bundle_prom_scalars': prom_scalars}
