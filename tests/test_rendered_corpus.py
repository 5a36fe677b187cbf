"""Every committed spec (and the templates' feature matrix) renders to the source it rendered to when the manifest
was recorded: a template change for new knobs must leave existing kernels' code, build keys and figures alone."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from render_manifest import MANIFEST, rendered_hashes  # noqa: E402


def test_committed_specs_render_as_recorded():
    recorded = json.loads(MANIFEST.read_text())
    hashes = rendered_hashes()
    assert len(recorded) > 2000
    assert hashes.keys() == recorded.keys(), sorted(hashes.keys() ^ recorded.keys())[:10]
    changed = sorted(k for k in recorded if recorded[k] != hashes[k])
    assert not changed, f"{len(changed)} rendered sources changed, e.g. {changed[:5]}"
