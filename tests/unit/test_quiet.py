"""Other libraries' start-up notices are kept off the commands' output; --verbose shows them."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from bridge_recipes.utils import quiet

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_filters(monkeypatch):
    monkeypatch.setattr(warnings, "filters", list(warnings.filters))
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    yield
    for name, _ in quiet.LOG_RECORDS:
        logging.getLogger(name).filters.clear()


def _warned(message: str, module: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet.install([])
        warnings.warn_explicit(message, UserWarning, "x.py", 1, module=module)
    return [str(w.message) for w in caught]


def test_known_notices_are_filtered_and_others_kept(clean_filters):
    assert _warned("Apex is not installed. Falling back to Torch Norm", "megatron.core.models.backends") == []
    assert _warned("Apex is not installed.", "my_project") == ["Apex is not installed."]  # another library's
    assert _warned("something else", "megatron.core.models.backends") == ["something else"]


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_known_log_records_are_dropped(clean_filters):
    quiet.install([])
    logger = logging.getLogger(quiet.LOG_RECORDS[0][0])
    kept = _Kept()
    logger.addHandler(kept)
    try:
        logger.warning("No CUDA runtime is found, using CUDA_HOME='/usr/local'")
        logger.warning("a warning of its own")
    finally:
        logger.removeHandler(kept)
    assert kept.messages == ["a warning of its own"]


def test_verbose_keeps_every_notice(clean_filters, monkeypatch):
    assert quiet.install(["--verbose"]) is False
    monkeypatch.setenv(quiet.VERBOSE_ENV, "1")
    assert quiet.install([]) is False
    monkeypatch.setenv(quiet.VERBOSE_ENV, "0")
    assert quiet.install([]) is True


def test_a_dry_run_prints_its_own_lines_first_and_no_known_notice(tmp_path):
    cmd = [
        sys.executable,
        "scripts/run_recipe.py",
        "--recipe",
        "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config",
        "--dry-run",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.stderr.splitlines()[0].startswith("[run_recipe] loading Megatron-Bridge")
    notices = [m for _, m in quiet.WARNINGS] + ["No CUDA runtime is found", "Gemma2:", "torch_dtype"]
    assert [n for n in notices if n in done.stdout + done.stderr] == []
