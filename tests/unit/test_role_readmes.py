"""Role READMEs cannot drift from meta/argument_specs.yml: every option of every entry point is in the
README's variable table with the spec's default, and no table lists a variable its entry point lacks.
A table under a heading "Entry point `x`" belongs to x; any other is main's, and an entry point without
a table of its own is checked against main's. An option without a spec default (computed in defaults/
or vars/) may describe its default in words."""
import json
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parents[1] for p in REPO.glob('roles/*/meta/argument_specs.yml'))


def readme_tables(role):
    """{entry point: {variable: default cell}} from the README's tables whose first header is Variable."""
    tables, entry, in_table = {}, 'main', False
    for line in (role / 'README.md').read_text().splitlines():
        heading = re.match(r'#+ .*Entry point `(\w+)`', line)
        if heading:
            entry = heading.group(1)
        cells = [c.strip().replace('\\|', '|') for c in re.split(r'(?<!\\)\|', line.strip())[1:-1]]
        if not cells:
            in_table = False
        elif cells[0].lower() == 'variable':
            in_table = True
        elif in_table and re.fullmatch(r'`\w+`', cells[0]):
            tables.setdefault(entry, {})[cells[0].strip('`')] = cells[1]
    return tables


def same(default, cell):
    """Loose match: `...` unquoted, then the text itself or its YAML value (scalars, lists, dicts); 0 is not false."""
    text = cell[1:-1] if re.fullmatch(r'`[^`]*`', cell) else cell
    if default == text:
        return True
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return json.dumps(value, sort_keys=True, default=str) == json.dumps(default, sort_keys=True, default=str)


@pytest.mark.parametrize('role', ROLES, ids=lambda r: r.name)
def test_readme_matches_argument_specs(role):
    specs = yaml.safe_load((role / 'meta' / 'argument_specs.yml').read_text())['argument_specs']
    tables, problems = readme_tables(role), []
    assert 'main' in tables, '%s/README.md has no variable table' % role.relative_to(REPO)
    for entry, spec in specs.items():
        options = spec.get('options') or {}
        rows = tables.get(entry, tables['main'])
        for name, opt in options.items():
            if name not in rows:
                problems.append('%s (entry point %s) is not in the README' % (name, entry))
            elif 'default' in opt and not same(opt['default'], rows[name]):
                problems.append('%s: README default %s, spec default %r' % (name, rows[name], opt['default']))
    for entry, rows in tables.items():
        problems += ['%s is in the README but not in entry point %s' % (name, entry)
                     for name in rows if name not in (specs.get(entry) or {}).get('options', {})]
    assert not problems, '%s/README.md:\n  ' % role.relative_to(REPO) + '\n  '.join(problems)
