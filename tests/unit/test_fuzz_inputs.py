"""Property-based fuzzing of the command lines: generated bad values, tokens and files, config
files, Hugging Face folders and loss logs.

For every generated input: a non-zero exit (2, bad input), no traceback, a message that names
the offending flag, field or token, and no input file changed. Runs are derandomized (the same
examples every run) and bounded, so CI time stays fixed.
"""

import contextlib
import io
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
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


# Hugging Face folders: generated values of the fields the checks read, and damaged shard headers.
HF_FIELDS = [
    "model_type",
    "num_hidden_layers",
    "full_attention_interval",
    "layer_types",
    "hidden_size",
    "num_experts",
    "partial_rotary_factor",
    "rope_parameters",
    "text_config",
    "head_dim",
]


@pytest.fixture(scope="module")
def hf_toy(tmp_path_factory):
    from bridge_recipes.hf.toy import make_toy

    root = tmp_path_factory.mktemp("hf_fuzz")
    make_toy(root / "moe", "moe", max_shard_size="5MB")
    return root / "moe"


def _copy(toy: Path, tmp: str, own: str) -> Path:
    """A folder of links to the toy's files, with ``own`` (the file a test edits) a copy."""
    folder = Path(tmp) / "moe"
    folder.mkdir()
    for f in toy.iterdir():
        if f.name == own:
            shutil.copy(f, folder / f.name)
        else:
            (folder / f.name).symlink_to(f)
    return folder


def _hf_outcome(folder: Path) -> None:
    """The folder is read and compared, or refused by HfCheckpointError; nothing else may escape."""
    from bridge_recipes.hf import checkpoint as ck

    try:
        found = ck.inspect_folder(folder)
        ck.check_folder_for_recipe(found, RECIPE, scaled=True)
        ck.check_folder_for_recipe(found, RECIPE)
    except ck.HfCheckpointError as exc:
        assert str(exc)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(HF_FIELDS), value=JSON | st.integers(min_value=-(2**70), max_value=2**70))
def test_hf_folder_with_any_config_value_is_checked_or_refused(hf_toy, name, value):
    with tempfile.TemporaryDirectory() as tmp:
        folder = _copy(hf_toy, tmp, "config.json")
        config = json.loads((folder / "config.json").read_text())
        config[name] = value
        (folder / "config.json").write_text(json.dumps(config))
        _hf_outcome(folder)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    length=st.integers(min_value=0, max_value=2**64 - 1),
    body=st.binary(max_size=64) | JSON.map(lambda v: json.dumps(v).encode()),
)
def test_hf_folder_with_a_damaged_shard_header_is_refused(hf_toy, length, body):
    import struct

    with tempfile.TemporaryDirectory() as tmp:
        shard_name = sorted(f.name for f in hf_toy.glob("*.safetensors"))[0]
        folder = _copy(hf_toy, tmp, shard_name)
        shard = folder / shard_name
        shard.write_bytes(struct.pack("<Q", length) + body + shard.read_bytes()[8:])
        _hf_outcome(folder)


# Config files: a saved config with a generated value put at a generated place, or a _target_ of any name.
@pytest.fixture(scope="module")
def saved_config():
    import bridge_recipes
    from bridge_recipes import config_files

    return config_files.to_text(bridge_recipes.build(RECIPE), RECIPE)


TARGET = st.one_of(
    st.sampled_from(
        [
            "torch.save",
            "os.system",
            "builtins.eval",
            "subprocess.run",
            "shutil.rmtree",
            "numpy.save",
            "megatron.core.dist_checkpointing.save",
            "transformers.AutoConfig.from_pretrained",
            "megatron.bridge.training.config.ConfigContainer.from_yaml",
            "signal.raise_signal",
        ]
    ),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz._", min_size=1, max_size=40),
)


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    target=TARGET,
    where=st.sampled_from(["profiling", "train.exit_signal", "model.activation_func", "logger"]),
    call=st.booleans(),
)
def test_config_file_naming_any_callable_is_refused_and_runs_nothing(saved_config, target, where, call):
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        data = yaml.safe_load(saved_config)
        parent, leaf = data, where.split(".")
        for part in leaf[:-1]:
            parent = parent[part]
        parent[leaf[-1]] = {"_target_": target, "_call_": call, "_args_": [f"{tmp}/written"]}
        path = Path(tmp) / "cfg.yaml"
        path.write_text(yaml.safe_dump(data))
        code, err = _run(["--config-file", str(path), "--dry-run", "--world-size", "8"])
        assert code == 2 and "Traceback" not in err
        assert f"key {where}" in err, err
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["cfg.yaml"]


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(cut=st.integers(min_value=0, max_value=10**6), junk=st.text(max_size=200))
def test_damaged_config_file_is_refused_or_built_never_a_traceback(saved_config, cut, junk):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cfg.yaml"
        at = cut % (len(saved_config) + 1)
        path.write_text(saved_config[:at] + junk + saved_config[at:])
        code, err = _run(["--config-file", str(path), "--dry-run", "--world-size", "8"])
        assert code in (0, 2) and "Traceback" not in err
        assert code == 0 or str(path) in err or "error" in err, err


# Loss logs: whole runs cut short, steps repeated, runs of one name; each refused by name.
def _iteration(step: int, total: int, loss: float) -> str:
    return (
        f" [t] iteration {step}/ {total} | elapsed time per iteration (ms): 100.0 | global batch size: 8 | "
        f"lm loss: {loss:.6E} |\n"
    )


@settings(max_examples=15, deadline=None, derandomize=True)
@given(total=st.integers(min_value=4, max_value=40), data=st.data())
def test_compare_losses_refuses_incomplete_or_repeated_runs(total, data):
    whole = "".join(_iteration(s, total, 10.0 / s) for s in range(1, total + 1))
    kind = data.draw(st.sampled_from(["cut", "repeat", "same_name"]))
    if kind == "cut":
        stop = data.draw(st.integers(min_value=1, max_value=total - 1))
        logs = [whole, "".join(_iteration(s, total, 10.0 / s) for s in range(1, stop + 1))]
        extra, text = [], f"stopped at step {stop} of {total}"
    elif kind == "repeat":
        again = data.draw(st.integers(min_value=1, max_value=total))
        logs = [whole, whole + _iteration(again, total, 1.0)]
        extra, text = [], "more than once"
    else:
        logs = [f"===== run a: x\n{whole}===== run b: x\n{whole}===== run a: x\n{whole}"]
        extra, text = ["--reference", "a", "--candidate", "b"], "more than one run named a"
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / f"{i}.log" for i in range(len(logs))]
        for p, text_ in zip(paths, logs):
            p.write_text(text_)
        p = subprocess.run(
            [sys.executable, str(ROOT / "scripts/compare_losses.py"), *map(str, paths), *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert p.returncode == 2 and "Traceback" not in p.stderr and text in p.stderr, p.stderr
