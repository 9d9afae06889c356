"""Property-based fuzzing of the command lines: generated bad values, tokens and files.

For every generated input: a non-zero exit (2, bad input), no traceback, a message that names
the offending flag, field or token, and no input file changed. Runs are derandomized (the same
examples every run) and bounded, so CI time stays fixed.
"""

import contextlib
import io
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge_recipes.data import sft_rows
from bridge_recipes.overrides import FLAG_KEYS
from bridge_recipes.runner.cli import main

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
TOKENIZER = ROOT / "docs/evidence/sft_rows_synthetic/tokenizer.json"
FUZZ = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

# Flags whose values must be integers >= 1 (or >= 0 for the warm-up), and the field each sets.
POSITIVE_INT_FLAGS = ["tp", "pp", "cp", "vp", "ep", "etp", "gb", "mb", "sl", "max_steps", "save_interval"]
FLOAT_FLAGS = ["lr", "min_lr"]


def _run(argv: list[str]) -> tuple[int, str]:
    """The runner in this process: exit code and stderr; any exception fails the test."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own errors exit 2 with a usage line
            code = exc.code
    return code, err.getvalue()


def _names_flag_or_field(text: str, dest: str) -> bool:
    option = f"-{dest}" if len(dest) <= 3 else f"--{dest.replace('_', '-')}"
    return option in text or any(key in text for key in FLAG_KEYS[dest].keys)


@FUZZ
@given(
    dest=st.sampled_from(POSITIVE_INT_FLAGS),
    value=st.one_of(st.integers(max_value=0), st.integers(min_value=10**12, max_value=10**30)),
)
def test_runner_refuses_out_of_range_integers(dest, value):
    if value > 0 and dest not in ("max_steps",):
        value = -value  # large values are a range error only for the step count
    code, err = _run(["--recipe", RECIPE, "--dry-run", "--world-size", "8", f"--{dest.replace('_', '-')}={value}"])
    assert code == 2 and "Traceback" not in err
    assert _names_flag_or_field(err, dest), err


@FUZZ
@given(
    dest=st.sampled_from(FLOAT_FLAGS),
    value=st.one_of(st.just(math.nan), st.just(math.inf), st.floats(max_value=-1e-12, allow_nan=False)),
)
def test_runner_refuses_bad_learning_rates(dest, value):
    code, err = _run(["--recipe", RECIPE, "--dry-run", "--world-size", "8", f"--{dest.replace('_', '-')}={value!r}"])
    assert code == 2 and "Traceback" not in err
    assert _names_flag_or_field(err, dest), err


TOKEN = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=30
).filter(lambda t: not t.startswith("-") and t.strip() == t and t)


@FUZZ
@given(token=TOKEN)
def test_runner_names_a_bad_override_token(token):
    code, err = _run(["--recipe", RECIPE, "--dry-run", "--world-size", "8", token])
    assert code == 2 and "Traceback" not in err
    key = token.split("=", 1)[0].lstrip("+~")
    assert repr(token) in err or key in err, err


@settings(max_examples=6, deadline=None, derandomize=True)
@given(blob=st.binary(min_size=0, max_size=2048))
def test_compare_losses_refuses_junk_logs_and_changes_nothing(blob):
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a.log", Path(tmp) / "b.log"
        a.write_bytes(blob)
        b.write_bytes(blob[::-1])
        p = subprocess.run(
            [sys.executable, str(ROOT / "scripts/compare_losses.py"), str(a), str(b), "--out", str(b)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert p.returncode == 2 and "Traceback" not in p.stderr
        assert "b.log" in p.stderr  # --out onto an input is refused first, naming it
        assert a.read_bytes() == blob and b.read_bytes() == blob[::-1]


GOOD = {
    "messages": [
        {"role": "user", "content": "what is the capital of france, and why is it there?"},
        {"role": "assistant", "content": "paris; the river seine made it a crossing and a port long ago."},
    ]
}
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
BAD_LINE = st.one_of(
    JSON.map(json.dumps),
    st.dictionaries(st.just("messages"), JSON, min_size=1).map(json.dumps),
    st.text(alphabet=st.characters(blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), max_size=40),
)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(bad=st.lists(BAD_LINE, min_size=1, max_size=8))
def test_row_builder_counts_and_skips_bad_lines(bad):
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        text = "\n".join([json.dumps(GOOD)] * 40 + bad) + "\n"
        src.write_text(text)
        manifest = sft_rows.build_sft_rows(
            src,
            TOKENIZER,
            Path(tmp) / "rows",
            row_tokens=64,
            chat_format="chatml",
            packing="eos_joined",
            progress=False,
        )
        counts = manifest["conversations"]
        # every line is accounted for: used, skipped by a named reason, or blank
        assert counts["used"] + counts["skipped_total"] + counts["blank_lines"] == 40 + len(bad)
        assert counts["used"] >= 40 and sum(counts["skipped"].values()) == counts["skipped_total"]
        assert src.read_text() == text
