"""Bad input, family by family: outputs never land on inputs, checks run before the work they
guard, nothing wrong is accepted silently, messages point at the right thing, and nothing is
left behind (exit 2 and no traceback for the command lines)."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge_recipes.chat.chat_template import TemplateRenderer
from bridge_recipes.chat.errors import SftRowsError
from bridge_recipes.data import sft_rows
from bridge_recipes.runner.cli import main
from bridge_recipes.utils.outputs import overlap_problem, staged_output, write_text_atomic

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
CHATML = ROOT / "tests/fixtures/chatml_tokenizer.json"
TEMPLATE = ROOT / "tests/fixtures/qwen35_chat_tokenizer"
GOOD = {
    "messages": [
        {"role": "user", "content": "what is the capital of france, and why is it there?"},
        {"role": "assistant", "content": "paris; the river seine made it a crossing and a port long ago."},
    ]
}


def _dry_run(capsys, *argv):
    code = main(["--recipe", RECIPE, "--dry-run", "--world-size", "8", *map(str, argv)])
    return code, capsys.readouterr().err


def _script(name, *args):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *map(str, args)], cwd=ROOT, capture_output=True, text=True
    )


def _jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ----------------------------------------------------------------- outputs over inputs


def test_overlap_sees_the_same_path_a_holding_folder_and_a_folder_inside(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.jsonl").write_text("x")
    (tmp_path / "link").symlink_to(data)
    inputs = [("--input", data / "in.jsonl")]
    assert "same path" in overlap_problem(tmp_path / "link" / "in.jsonl", option="--out", inputs=inputs)
    assert "holds --input" in overlap_problem(data, option="--out", inputs=inputs)
    assert "is inside --hf" in overlap_problem(data / "out", option="--out", inputs=[("--hf", data)])
    assert overlap_problem(tmp_path / "elsewhere", option="--out", inputs=inputs) is None


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_rows_builder_never_writes_over_its_input(tmp_path, overwrite):
    data = tmp_path / "data"
    data.mkdir()
    src = _jsonl(data / "in.jsonl", [GOOD] * 20)
    before = src.read_bytes()
    for out in (data, tmp_path):  # the folder holding the input, and a folder above it
        p = _script(
            "build_sft_rows.py",
            "--input",
            src,
            "--tokenizer",
            CHATML,
            "--chat-format",
            "chatml",
            "--out",
            out,
            "--row-tokens",
            "64",
            "--no-progress",
            *overwrite,
        )
        assert p.returncode == 2 and "--input" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert src.read_bytes() == before


@pytest.mark.parametrize("command", ["import", "toy"])
def test_converter_never_writes_over_or_into_its_input(tmp_path, capsys, command):
    from bridge_recipes.hf.cli import main as convert_main

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    if command == "import":
        argv = ["import", "--hf", folder, "--recipe", RECIPE, "--out", folder / "mcore", "--overwrite"]
        flag = "--hf"
    else:
        argv = ["toy", "--tokenizer-json", folder / "tokenizer.json", "--out", folder, "--overwrite"]
        flag = "--tokenizer-json"
    assert convert_main([str(a) for a in argv]) == 2
    assert flag in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "tokenizer.json"]


def test_save_config_is_kept_apart_from_the_hf_folder(tmp_path, capsys):
    code, err = _dry_run(capsys, "--hf-checkpoint", tmp_path, "--save-config", tmp_path / "cfg.yaml")
    assert code == 2 and "--save-config" in err and "--hf-checkpoint" in err
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------- checks that come too late


def test_export_hf_is_checked_at_the_dry_run(tmp_path, capsys, monkeypatch):
    from bridge_recipes.hf import run_hooks as hf_training

    class Ckpt:
        save, load, pretrained_checkpoint, hf_source_path = str(tmp_path / "run"), None, None, str(tmp_path / "hf")

    class Cfg:
        checkpoint = Ckpt

    for out, text in [
        (tmp_path / "run", "checkpoint.save"),
        (tmp_path / "run" / "hf", "checkpoint.save"),
        (tmp_path / "hf", "hf_checkpoint"),
    ]:
        with pytest.raises(ValueError, match="export_hf") as info:
            hf_training.check_export_target(Cfg, str(out))
        assert text in str(info.value)
    hf_training.check_export_target(Cfg, str(tmp_path / "export"))  # a free, writable folder passes
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        with pytest.raises(ValueError, match="not a writable folder"):
            hf_training.check_export_target(Cfg, str(locked / "new"))
    finally:
        locked.chmod(stat.S_IRWXU)


def test_absurd_row_tokens_are_refused_before_the_data_is_read(tmp_path):
    missing = tmp_path / "never-read.jsonl"  # the check comes first: the input is not even opened
    for row_tokens in (0, sft_rows.MAX_ROW_TOKENS + 1, 10**15):
        with pytest.raises(SftRowsError, match="--row-tokens"):
            sft_rows.build_sft_rows(missing, CHATML, tmp_path / "out", row_tokens=row_tokens, chat_format="chatml")


def test_a_huge_line_is_skipped_unread(tmp_path, monkeypatch):
    """A line far longer than its row never reaches the JSON parser or the tokenizer."""
    from bridge_recipes.chat import conversations

    huge = {"messages": [{"role": "user", "content": "x" * 200_000}, {"role": "assistant", "content": "y"}]}
    src = _jsonl(tmp_path / "in.jsonl", [GOOD] * 30 + [huge])
    decoded = []
    real = conversations.JsonlSource.decode
    monkeypatch.setattr(
        conversations.JsonlSource, "decode", lambda self, line, i: decoded.append(len(line)) or real(self, line, i)
    )
    m = sft_rows.build_sft_rows(
        src, CHATML, tmp_path / "out", row_tokens=64, chat_format="chatml", packing="eos_joined", progress=False
    )
    assert m["conversations"]["skipped"] == {"longer_than_row": 1}
    assert max(decoded) < 1000


def test_a_huge_parquet_conversation_is_skipped_before_tokenizing(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    huge = [{"role": "user", "content": "x" * 200_000}, {"role": "assistant", "content": "y"}]
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"messages": [GOOD["messages"]] * 30 + [huge]}), src)
    m = sft_rows.build_sft_rows(
        src, CHATML, tmp_path / "out", row_tokens=64, chat_format="chatml", packing="eos_joined", progress=False
    )
    assert m["conversations"]["skipped"] == {"longer_than_row": 1}
    assert "skipped before tokenizing" in m["conversations"]["skipped_examples"][0]


# ----------------------------------------------------------------- silent yes


def test_same_file_for_training_and_validation_is_refused(tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", [GOOD] * 20)
    (tmp_path / "again.jsonl").symlink_to(src)
    for val in (src, tmp_path / "again.jsonl"):
        with pytest.raises(SftRowsError, match="--val-input"):
            sft_rows.build_sft_rows(src, CHATML, tmp_path / "out", row_tokens=64, chat_format="chatml", val_input=val)


TOOL_CALL = {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
SKIPPED = [
    (
        [{"role": "user", "content": "q"}, {"role": "tool", "content": "42"}, {"role": "assistant", "content": "a"}],
        "tool_result_without_call",
    ),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}], "empty_assistant_reply"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "  \n"}], "empty_assistant_reply"),
]


@pytest.mark.parametrize("messages,reason", SKIPPED, ids=[s[1] + str(i) for i, s in enumerate(SKIPPED)])
def test_template_rendering_skips_with_a_reason(messages, reason):
    from bridge_recipes.chat.conversations import MalformedConversation

    with pytest.raises(MalformedConversation) as info:
        TemplateRenderer(TEMPLATE).render(messages, index=3)
    assert info.value.reason == reason


def test_tool_results_after_a_tool_call_still_render():
    messages = [
        {"role": "user", "content": "q"},
        TOOL_CALL,
        {"role": "tool", "content": "1"},
        {"role": "tool", "content": "2"},
        {"role": "assistant", "content": "a"},
    ]
    ids, mask = TemplateRenderer(TEMPLATE).render(messages, index=0)
    assert mask.sum() > 0


def test_chatml_skips_an_empty_assistant_reply():
    from bridge_recipes.chat.chat_render import validate_conversation
    from bridge_recipes.chat.conversations import MalformedConversation

    with pytest.raises(MalformedConversation) as info:
        validate_conversation([{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}], 0)
    assert info.value.reason == "empty_assistant_reply"


# ----------------------------------------------------------------- messages


@pytest.mark.parametrize(
    "token,text",
    [
        ("lr=1e-5", "Did you mean optimizer.lr"),
        ("seq_length=4096", "model.seq_length"),
        ("模型.lr=1", "key '模型.lr'"),
        ("optimizer.lr_é=1", "key 'optimizer.lr_é'"),
    ],
)
def test_messages_point_at_the_key(capsys, token, text):
    code, err = _dry_run(capsys, token)
    assert code == 2 and text in err and "quote the value" not in err, err


def test_gpus_and_world_size_conflict_is_named(capsys):
    code, err = _dry_run(capsys, "--scale-down", "4", "--gpus", "2")
    assert code == 2 and re.search(r"--gpus 2\b.*--world-size 8\b.*conflict", err), err


def test_a_rows_file_given_as_the_rows_folder_names_the_folder(tmp_path):
    from bridge_recipes.data.integrity import RowsIntegrityError, read_manifest

    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "rows.parquet").write_bytes(b"PAR1")
    with pytest.raises(RowsIntegrityError) as info:
        read_manifest(rows / "rows.parquet")
    assert f"set it to {rows}" in str(info.value) and "--overwrite" not in str(info.value)


# ----------------------------------------------------------------- leftovers


def test_saved_text_gets_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a.yaml", "x")
        assert stat.S_IMODE((tmp_path / "a.yaml").stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_a_killed_builds_staging_folder_is_removed(tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", [GOOD] * 200_000)
    out = tmp_path / "rows"
    p = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts/build_sft_rows.py"),
            "--input",
            str(src),
            "--tokenizer",
            str(CHATML),
            "--chat-format",
            "chatml",
            "--out",
            str(out),
            "--row-tokens",
            "64",
            "--no-progress",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".rows.tmp-*")) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert p.poll() is None, "the build finished before it could be stopped"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 128 + signal.SIGTERM
    assert sorted(x.name for x in tmp_path.iterdir()) == ["in.jsonl"]


def test_a_dead_converters_staging_folder_goes_at_the_next_run(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".out.partial-{dead.stdout.strip()}"
    stale.mkdir()
    with staged_output(tmp_path / "out") as tmp:
        (tmp / "f").write_text("x")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out"]
