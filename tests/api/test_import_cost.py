"""`import finetune` and reaching the Python API's functions stay cheap: no deep-learning or data library is imported
until a stage runs (finetune/__init__.py, finetune/api/: late imports)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformers", "accelerate", "datasets", "pandas", "sklearn", "tokenizers")
ROOT = Path(__file__).resolve().parents[2]


def imported_after(code: str) -> list[str]:
    """The heavy modules imported by `code` in a fresh interpreter, run from the checkout."""
    script = f"import sys\n{code}\nimport json\nprint(json.dumps(sorted(sys.modules)))"
    output = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    modules = json.loads(output.stdout.strip().splitlines()[-1])
    return [name for name in HEAVY if name in modules]


def test_importing_the_package_and_reaching_the_api_imports_no_heavy_library():
    assert imported_after("import finetune") == []
    code = "import finetune\nassert callable(finetune.finetune) and callable(finetune.evaluate)\nfinetune.RunResult"
    assert imported_after(code) == []


def test_the_api_is_listed_on_the_package():
    import finetune

    assert {"finetune", "pretrain", "ulmfit", "evaluate", "RunResult", "predict"} <= set(dir(finetune))
    assert set(finetune.__all__) >= {"finetune", "pretrain", "ulmfit", "evaluate", "RunResult", "predict"}
