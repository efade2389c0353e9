"""Render inventory/prod and record every file's sha256 in tests/render/prod-render.sha256.

--no-pools: instead, render inventory/prod without its pools (test_render_prod.NO_POOLS), print the files that differ
from tests/render/prod-no-pools-render.sha256 and, with --write, record it. That manifest holds issue 34's promise
(an inventory without pools renders as before pools): re-record it only for a change every inventory gets (a new
unit, a new alert), after reading the list, and say so in the commit.
"""
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import REPO, apply_patch, render, render_manifest  # noqa: E402


def _pairs(text):
    return dict(reversed(line.split('  ', 1)) for line in text.splitlines())


with tempfile.TemporaryDirectory() as out:
    out = Path(out)
    if '--no-pools' in sys.argv:
        from test_render_prod import NO_POOLS, NO_POOLS_MANIFEST  # noqa: E402
        shutil.copytree(REPO / 'inventory' / 'prod', out / 'inventory')
        apply_patch(out / 'inventory', NO_POOLS)
        res = render(out / 'inventory', out / 'render')
        if res.returncode != 0:
            sys.exit(res.stdout[-4000:] + res.stderr[-2000:])
        got, want = _pairs(render_manifest(out / 'render')), _pairs(NO_POOLS_MANIFEST.read_text())
        print('\n'.join(sorted(f for f in set(got) | set(want) if got.get(f) != want.get(f))) or 'no file differs')
        if '--write' in sys.argv:
            NO_POOLS_MANIFEST.write_text(render_manifest(out / 'render'))
            print('wrote', NO_POOLS_MANIFEST.relative_to(REPO))
        sys.exit(0)
    res = render(REPO / 'inventory' / 'prod', out)
    if res.returncode != 0:
        sys.exit(res.stdout[-4000:] + res.stderr[-2000:])
    (REPO / 'tests' / 'render' / 'prod-render.sha256').write_text(render_manifest(out))
print('wrote tests/render/prod-render.sha256')
