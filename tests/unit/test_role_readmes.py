"""Role READMEs cannot drift from meta/argument_specs.yml because they hold no copy of it: the one reference of the
variables is docs/variables.md, generated from the specs (scripts/docs/variables.py; tests/unit/test_docs.py fails
when it is stale). Each README links to its role's section there, and to the section of every other entry point
that takes options, and carries no variable table of its own (a table whose first header is Variable). What a
table cannot say (how the variables work together, examples) stays in the README's prose."""
import re
from pathlib import Path

import pytest
import yaml
from test_docs import slug  # GitHub's anchor of a heading, as the link test checks it

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parents[1] for p in REPO.glob('roles/*/meta/argument_specs.yml'))
VARIABLES = 'docs/variables.md'


def variable_tables(text):
    """Line numbers of the tables whose first header is Variable (a copy of the specs)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        cells = [c.strip() for c in re.split(r'(?<!\\)\|', line.strip())[1:-1]]
        if cells and cells[0].lower() == 'variable':
            out.append(n)
    return out


def problems(role_name, readme_text, specs):
    """What is wrong with a role README, given its argument specs ({entry point: spec})."""
    out = ['line %d: a variable table (docs/variables.md is the one reference: link to it)' % n
           for n in variable_tables(readme_text)]
    wanted = [role_name] + [slug('%s: entry point `%s`' % (role_name, e)) for e, s in specs.items()
                            if e != 'main' and (s or {}).get('options')]
    for anchor in wanted:
        if '../../%s#%s)' % (VARIABLES, anchor) not in readme_text:
            out.append('no link to %s#%s' % (VARIABLES, anchor))
    return out


@pytest.mark.parametrize('role', ROLES, ids=lambda r: r.name)
def test_readme_links_to_the_generated_variables_and_copies_none(role):
    specs = yaml.safe_load((role / 'meta' / 'argument_specs.yml').read_text())['argument_specs']
    found = problems(role.name, (role / 'README.md').read_text(), specs)
    assert not found, '%s/README.md:\n  ' % role.relative_to(REPO) + '\n  '.join(found)


def test_the_check_fails_on_a_copied_table_and_a_missing_link():
    specs = {'main': {'options': {'x_port': {'type': 'int'}}}, 'scale': {'options': {'x_n': {'type': 'int'}}},
             'empty': {}}
    good = ('Variables: [docs/variables.md](../../docs/variables.md#x).\n'
            'Entry point scale: [docs/variables.md](../../docs/variables.md#x-entry-point-scale).\n')
    assert problems('x', good, specs) == []
    copied = good + '\n| Variable | Default |\n|---|---|\n| `x_port` | `1` |\n'
    assert problems('x', copied, specs) == ['line 4: a variable table (docs/variables.md is the one reference: link to it)']
    assert problems('x', good.splitlines()[0], specs) == ['no link to docs/variables.md#x-entry-point-scale']
