"""Property-based fuzzing of the command lines: generated bad values, tokens and files, config
files, Hugging Face folders and loss logs.

For every generated bad input: a non-zero exit (2, bad input), no traceback, a message that names
the offending flag, field or token, and no input file changed. Every command line (the runner's
dry run with generated dotted overrides, the row and VL dataset builders, inspect_rows,
compare_losses, the checkpoint converter) also gets generated arguments that may be valid: it
exits 0, 1 or 2, never with a traceback, within a time limit, and writes nothing outside the
test's temporary folder. Runs are derandomized (the same examples every run) and bounded, so CI
time stays fixed.
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

from bridge_recipes.config.overrides import FLAG_KEYS
from bridge_recipes.data import sft_rows
from bridge_recipes.runner.cli import main

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
TOKENIZER = ROOT / "tests/fixtures/chatml_tokenizer.json"
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
    from bridge_recipes.hf import architecture
    from bridge_recipes.hf import checkpoint as ck
    from bridge_recipes.hf.files import HfCheckpointError

    try:
        found = ck.inspect_folder(folder)
        architecture.check_folder_for_recipe(found, RECIPE, scaled=True)
        architecture.check_folder_for_recipe(found, RECIPE)
    except HfCheckpointError as exc:
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
    from bridge_recipes.config import files as config_files

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
        path.write_text(f"# recipe: {RECIPE}\n" + yaml.safe_dump(data))  # with its recipe line, as saved
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


def _config_places() -> list[str]:
    """Every top-level section of a saved config and every block of its features section."""
    import dataclasses

    from bridge_recipes.features import Features
    from bridge_recipes.recipe_config import RecipeConfig

    sections = [f.name for f in dataclasses.fields(RecipeConfig) if not f.name.startswith("_")]
    return sections + [f"features.{f.name}" for f in dataclasses.fields(Features)]


def _field_takes(where: str, value) -> bool:
    """Whether the field at ``where`` takes ``value`` as it is (null in an optional section, a preset name,
    a mapping of names for env_vars): the test's oracle, from the real annotations."""
    import typing

    from bridge_recipes.recipe_config import RecipeConfig

    if where.startswith("features"):
        return False  # the section and its blocks take only their config class
    hint = typing.get_type_hints(RecipeConfig)[where]
    if typing.get_origin(hint) is dict:
        return isinstance(value, dict) and all(isinstance(v, str | int | float) for v in value.values())
    args = typing.get_args(hint) or (hint,)
    return (value is None and type(None) in args) or (isinstance(value, str) and str in args)


# One value of each wrong kind: a number, a list, null, a string, a mapping without _target_.
WRONG_KINDS = {"int": 5, "list": [1, "a"], "null": None, "string": "flash_varlen", "no_target": {"enabled": True}}
WRONG_VALUE = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.lists(st.integers() | st.text(max_size=8), max_size=3),
    st.none(),
    st.text(max_size=20),
    st.dictionaries(
        st.text(alphabet="abcdefghij_", min_size=1, max_size=8).filter(lambda k: k != "_target_"),
        st.integers() | st.text(max_size=8) | st.lists(st.integers(), max_size=2),
        max_size=3,
    ),
)


def _config_with(saved_config: str, tmp: str, where: str, value) -> Path:
    import yaml

    data = yaml.safe_load(saved_config)
    parent, parts = data, where.split(".")
    for part in parts[:-1]:
        parent = parent[part]
    parent[parts[-1]] = value
    path = Path(tmp) / "cfg.yaml"
    path.write_text(f"# recipe: {RECIPE}\n" + yaml.safe_dump(data))
    return path


def _refused_naming(path: Path, where: str) -> None:
    code, err = _run(["--config-file", str(path), "--dry-run", "--world-size", "8"])
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert f"config file {path}: " in err and where in err, err[-2000:]
    assert "loading Megatron-Bridge" not in err  # answered before Megatron is imported


@pytest.mark.parametrize("kind", list(WRONG_KINDS))
@pytest.mark.parametrize("where", _config_places())
def test_config_file_section_of_a_wrong_kind_is_refused_naming_it(saved_config, where, kind):
    value = WRONG_KINDS[kind]
    if _field_takes(where, value):
        pytest.skip(f"{where} takes {value!r}")
    with tempfile.TemporaryDirectory() as tmp:
        _refused_naming(_config_with(saved_config, tmp, where, value), where)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(where=st.sampled_from(_config_places()), value=WRONG_VALUE)
def test_config_file_section_of_any_wrong_value_is_refused_naming_it(saved_config, where, value):
    from hypothesis import assume

    assume(not _field_takes(where, value))
    with tempfile.TemporaryDirectory() as tmp:
        _refused_naming(_config_with(saved_config, tmp, where, value), where)


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


# Every command line, with generated bad arguments: exit 0, 1 or 2, never a traceback, within a time
# limit, and nothing written outside the test's temporary folder.
def _tree_state() -> tuple[str, list[str]]:
    """What the checkout holds beyond its commits (changed, new and ignored files) and the runner's
    conversion cache: a command that wrote anywhere but its temporary folder changes one of them."""
    from bridge_recipes.hf.importer import cache_root

    status = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    cache = cache_root()
    return status, sorted(p.name for p in cache.iterdir()) if cache.is_dir() else []


@pytest.fixture(scope="module")
def untouched():
    """Asserts, after the module's tests that use it, that the checkout and the cache are as before."""
    before = _tree_state()
    yield
    assert _tree_state() == before


@pytest.fixture(scope="module")
def config_keys():
    """The dotted keys of the recipe's config, three sections deep."""
    import dataclasses

    import bridge_recipes

    keys: list[str] = []

    def walk(obj, prefix: str, depth: int) -> None:
        for f in dataclasses.fields(obj):
            if f.name.startswith("_"):
                continue
            value = getattr(obj, f.name, None)
            keys.append(prefix + f.name)
            if depth and dataclasses.is_dataclass(value) and not isinstance(value, type):
                walk(value, f"{prefix}{f.name}.", depth - 1)

    walk(bridge_recipes.build(RECIPE), "", 2)
    return sorted(keys)


VALUE = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats().map(repr),
    st.sampled_from(["null", "true", "false", "[]", "[1,2]", "[a]", "{}", "''", "1e400", "-0", "~", "/", "x/y"]),
    st.text(alphabet="abcxyz_/.-0123456789", min_size=1, max_size=12),
)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_runner_dry_run_with_random_dotted_overrides(untouched, config_keys, data):
    """Real keys (and keys one part off) set to generated values: built and checked (0) or refused (2)."""
    tokens = []
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        key = data.draw(st.sampled_from(config_keys))
        kind = data.draw(st.sampled_from(["as is", "as is", "extra part", "drop first", "prefix"]))
        if kind == "extra part":
            key += "." + data.draw(st.text(alphabet="abc_", min_size=1, max_size=5))
        elif kind == "drop first" and "." in key:
            key = key.split(".", 1)[1]
        elif kind == "prefix":
            key = data.draw(st.sampled_from(["+", "++", "~"])) + key
        tokens.append(key if key.startswith("~") else f"{key}={data.draw(VALUE)}")
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp), _within(60):
        code, err = _run(["--recipe", RECIPE, "--dry-run", "--world-size", "8", *tokens])
        assert code in (0, 2) and "Traceback" not in err, (tokens, err[-2000:])
        assert code == 0 or "error" in err, (tokens, err[-2000:])
        assert list(Path(tmp).iterdir()) == []  # a dry run writes nothing


def _script(name: str, *args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _inputs(tmp: Path) -> dict[str, str]:
    """Named inputs of every kind a command is given by mistake (all local: nothing looks like a hub id)."""
    (tmp / "folder").mkdir()
    (tmp / "empty.jsonl").write_text("")
    (tmp / "binary.jsonl").write_bytes(bytes(range(256)) * 4)
    (tmp / "good.jsonl").write_text((json.dumps(GOOD) + "\n") * 8)
    return {
        "missing": str(tmp / "nowhere.jsonl"),
        "folder": str(tmp / "folder"),
        "empty": str(tmp / "empty.jsonl"),
        "binary": str(tmp / "binary.jsonl"),
        "good": str(tmp / "good.jsonl"),
    }


SMALL_NUMBER = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
    st.sampled_from(["0", "-1", "nan", "inf", "1e9", "0.5", "x", ""]),
)


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    source=st.sampled_from(["missing", "folder", "empty", "binary", "good"]),
    flag=st.sampled_from(["--row-tokens", "--val-fraction", "--max-rows", "--workers", "--chat-format", "--seed"]),
    value=SMALL_NUMBER,
)
def test_build_sft_rows_with_bad_arguments(untouched, source, flag, value):
    with tempfile.TemporaryDirectory() as tmp:
        given = _inputs(Path(tmp))
        out = Path(tmp) / "rows"
        args = ["--input", given[source], "--tokenizer", str(TOKENIZER), "--chat-format", "chatml", "--out", str(out)]
        p = _script("build_sft_rows.py", *args, "--no-progress", f"{flag}={value}")
        assert p.returncode in (0, 2) and "Traceback" not in p.stderr, (source, flag, value, p.stderr[-2000:])
        assert sorted(q.name for q in Path(tmp).iterdir() if q.name != "rows") == sorted(
            Path(v).name for v in given.values() if Path(v).exists()
        )


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    rows=st.lists(st.integers(min_value=-(2**63), max_value=2**63), max_size=3),
    split=st.sampled_from(["train", "val", "test", ""]),
    tokenizer=st.sampled_from([None, "missing", "folder", "binary"]),
)
def test_inspect_rows_with_bad_arguments(untouched, built_rows, rows, split, tokenizer):
    """The script catches RowsIntegrityError alone: anything else would be a traceback."""
    from bridge_recipes.data.inspect_rows import inspect_rows
    from bridge_recipes.data.integrity import RowsIntegrityError

    with tempfile.TemporaryDirectory() as tmp:
        given = _inputs(Path(tmp))
        try:
            inspect_rows(built_rows, rows or None, split, given.get(tokenizer) if tokenizer else None)
        except RowsIntegrityError as exc:
            assert str(exc)


@pytest.fixture(scope="module")
def built_rows(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_rows")
    src = root / "in.jsonl"
    src.write_text((json.dumps(GOOD) + "\n") * 40)
    sft_rows.build_sft_rows(src, TOKENIZER, root / "rows", row_tokens=256, chat_format="chatml", progress=False)
    return root / "rows"


def test_inspect_rows_script_exits_2_on_bad_arguments(untouched, built_rows):
    for args in (["--row", "x"], ["--split", "test"], ["--row", str(2**70)], ["--tokenizer", "/nowhere"]):
        p = _script("inspect_rows.py", str(built_rows), *args)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (args, p.stderr)


LOSS = st.one_of(st.floats(), st.sampled_from([0.0, -1.0, 1e308, 5e-324]))


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(a=st.lists(LOSS, min_size=3, max_size=12), b=st.lists(LOSS, min_size=3, max_size=12))
def test_compare_losses_with_any_loss_values_compares(untouched, a, b):
    """Well-formed curves of any values, inf and nan included: agree (0) or disagree (1), never bad input."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / "a.txt", Path(tmp) / "b.txt"]
        for path, curve in zip(paths, (a, b)):
            path.write_text("".join(f"{s} {v!r}\n" for s, v in enumerate(curve, 1)))
        p = _script("compare_losses.py", *map(str, paths))
        assert p.returncode in (0, 1) and "Traceback" not in p.stderr, (a, b, p.stderr[-2000:])


@contextlib.contextmanager
def _within(seconds: int):
    """Fails the example (TimeoutError) when the command in the block runs longer than ``seconds``."""
    import signal

    def expire(*_):
        raise TimeoutError(f"the command ran over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _in_process(main, argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with _within(60), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    source=st.sampled_from(["missing", "folder", "empty", "binary", "good"]),
    processor=st.sampled_from(["missing", "folder", "binary"]),
    flag=st.sampled_from(
        ["--val-fraction", "--seed", "--samples-per-shard", "--max-image-bytes", "--max-image-pixels"]
    ),
    value=SMALL_NUMBER,
)
def test_build_vl_dataset_with_bad_arguments(untouched, source, processor, flag, value):
    from bridge_recipes.vl.vl_cli import main as vl_main

    with tempfile.TemporaryDirectory() as tmp:
        given = _inputs(Path(tmp))
        argv = ["--input", given[source], "--processor", given[processor], "--out", str(Path(tmp) / "ds")]
        code, err = _in_process(vl_main, [*argv, "--no-progress", f"{flag}={value}"])
        assert code in (0, 2) and "Traceback" not in err, (source, processor, flag, value, err[-2000:])
        assert not (Path(tmp) / "ds").exists()


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    command=st.sampled_from(["import", "export"]),
    source=st.sampled_from(["missing", "folder", "binary", "good"]),
    recipe=st.sampled_from([RECIPE, "qwen35_nope", "", "qwen35_35b_a3b"]),
    out=st.sampled_from(["new", "source", "inside"]),
)
def test_convert_checkpoint_with_bad_arguments(untouched, command, source, recipe, out):
    from bridge_recipes.hf.cli import main as hf_main

    with tempfile.TemporaryDirectory() as tmp:
        given = _inputs(Path(tmp))
        target = {"new": str(Path(tmp) / "out"), "source": given[source], "inside": f"{given[source]}/out"}[out]
        argv = {
            "import": ["import", "--hf", given[source], "--recipe", recipe, "--out", target],
            "export": ["export", "--megatron", given[source], "--recipe", recipe, "--out", target],
        }[command]
        code, err = _in_process(hf_main, [*argv, "--no-progress"])
        assert code in (0, 2) and "Traceback" not in err, (argv, err[-2000:])
        assert not (Path(tmp) / "out").exists()


BAD_BENCHMARK_ARGS = st.sampled_from(
    [
        ["--steps", "0"],
        ["--steps", "x"],
        ["--window", "9", "3"],
        ["--window", "-1", "4"],
        ["--recipe", "qwen35_nope"],
        ["--rows", "missing"],
        ["--gpu-memory-gb", "-4"],
        ["--proxy-layers", "3"],
        ["train.trian_iters=5"],
    ]
)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    bad=BAD_BENCHMARK_ARGS,
    other=st.lists(
        st.sampled_from(
            [["--lora-from-random-init"], ["--steps", "12"], ["--window", "3", "9"], ["--against", RECIPE]]
        ),
        max_size=2,
    ),
    out=st.sampled_from(["new", "folder", "binary"]),
)
def test_benchmark_with_bad_arguments_is_refused_and_runs_nothing(untouched, bad, other, out):
    """Each case holds one bad argument: refused (2) before any run starts, no traceback, nothing written."""
    from bridge_recipes.bench.benchmark import main as bench_main

    with tempfile.TemporaryDirectory() as tmp:
        given = _inputs(Path(tmp))
        target = {"new": str(Path(tmp) / "r.yaml"), "folder": given["folder"], "binary": given["binary"]}[out]
        bad = [given["missing"] if a == "missing" else a for a in bad]
        argv = ["--recipe", RECIPE, *[a for o in other for a in o], *bad, "--out", target]
        code, err = _in_process(bench_main, argv)
        assert code == 2 and "Traceback" not in err, (argv, err[-2000:])
        assert not (Path(tmp) / "r.yaml").exists() and Path(given["binary"]).read_bytes() == bytes(range(256)) * 4


# Turn keys and record shapes a real file holds by mistake: a record of another format, weights of any
# value, a system prompt of any type, reasoning on any turn, lines in another encoding. Every line is
# accounted for (used, skipped by a named reason, or blank), and what was kept is counted.
TURN_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.floats(allow_nan=False), st.text(max_size=8))


def _odd_record(kind: str, value) -> dict:
    user, reply = {"role": "user", "content": "a question here"}, {"role": "assistant", "content": "an answer"}
    if kind == "weight":
        return {"messages": [user, {**reply, "weight": value}]}
    if kind == "reasoning_on_user":
        return {"messages": [{**user, "reasoning_content": value}, reply]}
    if kind == "sharegpt_system":
        return {
            "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}],
            "system": value,
        }
    if kind == "alpaca":
        return {"instruction": "say hi", "output": value if isinstance(value, str) else "hi"}
    return {"messages": [user, reply, {"role": "user", "content": value if isinstance(value, str) else "?"}]}


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    odd=st.lists(
        st.tuples(
            st.sampled_from(["weight", "reasoning_on_user", "sharegpt_system", "alpaca", "trailing_user"]), TURN_VALUE
        ),
        min_size=1,
        max_size=6,
    ),
    latin1=st.booleans(),
    repeats=st.integers(0, 5),
)
def test_row_builder_reads_odd_records_per_record_and_accounts_for_each(odd, latin1, repeats):
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        lines = [json.dumps(GOOD).encode()] * (40 + repeats) + [json.dumps(_odd_record(k, v)).encode() for k, v in odd]
        if latin1:
            lines.append(
                json.dumps({"messages": GOOD["messages"], "note": "caf\u00e9"}, ensure_ascii=False).encode("latin-1")
            )
        data = b"\n".join(lines) + b"\n"
        src.write_bytes(data)
        manifest = sft_rows.build_sft_rows(
            src,
            TOKENIZER,
            Path(tmp) / "rows",
            row_tokens=256,
            chat_format="chatml",
            progress=False,
            dedupe=repeats > 2,
        )
        c = manifest["conversations"]
        assert c["used"] + c["skipped_total"] + c["blank_lines"] == len(lines)
        assert sum(c["record_formats"].values()) == c["used"] and c["duplicates"] >= 39 + repeats
        assert all(e.startswith("line ") for e in c["skipped_examples"])
        assert src.read_bytes() == data


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    entries=st.lists(st.sampled_from(["notes.txt", "sub/", "rows.parquet", "config.json", ".hidden"]), max_size=4),
    overwrite=st.booleans(),
)
def test_staged_output_never_replaces_a_folder_it_did_not_write(entries, overwrite):
    from bridge_recipes.utils.outputs import staged_output

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        for name in entries:
            (out / name.rstrip("/")).mkdir(exist_ok=True) if name.endswith("/") else (out / name).write_text("mine")
        before = sorted(p.name for p in out.iterdir())
        try:
            with staged_output(out, overwrite) as staged:
                (staged / "new").write_text("x")
        except OSError as exc:
            assert "--out" in str(exc)
            assert sorted(p.name for p in out.iterdir()) == before
        else:
            assert not before  # only an empty folder was taken


@FUZZ
@given(
    cap=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr), st.sampled_from(["80", "48", "1e9", "-0", "x"])
    ),
    gpu=st.one_of(st.none(), st.sampled_from(["h100", "a100-40", "H200", "rtx6000ada", "tpu", ""])),
)
def test_runner_memory_caps_and_cards_are_planned_or_refused(cap, gpu):
    argv = ["--recipe", RECIPE, "--dry-run", "--world-size", "8", f"--gpu-memory-gb={cap}"]
    argv += [f"--gpu={gpu}"] if gpu is not None else []
    code, err = _run(argv)
    assert code in (0, 2) and "Traceback" not in err, (argv, err[-2000:])
    if gpu is not None:  # both name the memory: refused before anything is built
        assert code == 2 and "loading Megatron-Bridge" not in err
