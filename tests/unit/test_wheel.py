"""The project works as a plain wheel: schemas and bundled examples ship inside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_plain_wheel_carries_its_data_and_lints_a_bundled_example(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True)
    wheel = next((tmp_path / "dist").glob("askwright_bridge-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "bridge/_data/schemas/matrix/dev.superpipeline.question.answer.v2.json" in names
    assert "bridge/_data/examples/release-decisions/questions.json" in names
    # Installed apart from the source tree, run from elsewhere: only the wheel's copy can be found.
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp_path / "site"),
                    str(wheel)], check=True)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    where = subprocess.run([sys.executable, "-c", "import bridge.resources as r; print(r.examples_dir())"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(tmp_path / "site"))
    lint = subprocess.run([sys.executable, "-m", "bridge", "lint", "--json", "--no-probe",
                           f"{where}/release-decisions"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stderr
    assert json.loads(lint.stdout)["ok"] is True
