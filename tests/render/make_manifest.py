"""Render inventory/prod and record every file's sha256 in tests/render/prod-render.sha256."""
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import REPO, render, render_manifest  # noqa: E402

with tempfile.TemporaryDirectory() as out:
    res = render(REPO / 'inventory' / 'prod', out)
    if res.returncode != 0:
        sys.exit(res.stdout[-4000:] + res.stderr[-2000:])
    (REPO / 'tests' / 'render' / 'prod-render.sha256').write_text(render_manifest(out))
print('wrote tests/render/prod-render.sha256')
