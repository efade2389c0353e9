"""Read one value out of a Prometheus text exposition (a master's /metrics read by a playbook).

- metric(text, name): the value of the unlabelled series `name`, 0.0 when absent (a master that has not counted
  anything yet exports it as 0 or not at all).
"""
import re


def metric(text, name):
    m = re.search(r'^%s(?:\{\})?\s+(\S+)\s*$' % re.escape(str(name)), str(text or ''), re.M)
    try:
        return float(m.group(1)) if m else 0.0
    except ValueError:
        return 0.0


class FilterModule(object):
    def filters(self):
        return {'bundle_metric': metric}
