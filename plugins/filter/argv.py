"""A command line with some flags' values replaced: playbooks/benchmark.yml runs a second router with the real
router's argv (read from its rendered environment file, the one place it is built) and only its own address,
port and policy changed.
"""


def argv_set(argv, overrides):
    """argv (a list, or a string split on whitespace as systemd splits $VAR) with each flag of overrides
    ({'--flag': value}) given that value: the value after the flag is replaced where the flag is, the pair is
    appended where it is not. Every override takes exactly one value; a flag given twice, or last with no
    value, is refused (the result would be ambiguous)."""
    out = list(argv.split() if isinstance(argv, str) else argv or [])
    for flag, value in (overrides or {}).items():
        where = [i for i, a in enumerate(out) if a == flag]
        if len(where) > 1:
            raise ValueError('argv_set: %s appears %d times' % (flag, len(where)))
        if not where:
            out += [flag, str(value)]
            continue
        i = where[0]
        if i + 1 >= len(out) or out[i + 1].startswith('--'):
            raise ValueError('argv_set: %s has no value to replace' % flag)
        out[i + 1] = str(value)
    return out


class FilterModule(object):
    def filters(self):
        return {'bundle_argv_set': argv_set}
