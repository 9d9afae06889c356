"""A config file received from someone else runs nothing of its choosing: callables outside the
config classes and the named list, partial calls, oversized files and alias bombs are refused
(exit 2, the key named), before anything in the file is built, also in a dry run."""

import pytest

import bridge_recipes
from bridge_recipes.config import files as config_files
from bridge_recipes.config import safety as config_safety
from bridge_recipes.runner.cli import main

SFT = "qwen35_35b_a3b_sft_8gpu_h200_bf16_mock_config"


@pytest.fixture(scope="module")
def saved_text():
    return config_files.to_text(bridge_recipes.build(SFT), SFT)


SIGNAL = "    _call_: true\n    _name_: SIGTERM\n    _target_: signal.Signals"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)
)
EVIL = [  # (name, edit of the saved text, text the refusal holds)
    (
        "torch_save_called",
        lambda t, tmp: t.replace(SIGNAL, f"    _args_: [{{}}, {tmp}/pwned]\n    _target_: torch.save").replace(
            "    _args_:\n    - 15\n", ""
        ),
        "train.exit_signal._target_",
    ),
    (
        "method_called",
        lambda t, tmp: t.replace(
            "_target_: megatron.bridge.training.config.ProfilingConfig",
            "_target_: megatron.bridge.models.conversion.auto_bridge.AutoBridge.from_hf_pretrained",
        ),
        "profiling._target_",
    ),
    (
        "function_under_megatron",
        lambda t, tmp: t.replace(
            "_target_: megatron.bridge.training.config.ProfilingConfig",
            "_target_: megatron.core.dist_checkpointing.save",
        ),
        "profiling._target_",
    ),
    (
        "unlisted_reference",
        lambda t, tmp: t.replace("_target_: torch.nn.functional.silu", "_target_: os.remove"),
        "model.activation_func._target_",
    ),
    ("partial", lambda t, tmp: t.replace(SIGNAL, SIGNAL + "\n    _partial_: true"), "train.exit_signal._partial_"),
    (
        "args_to_a_config_class",
        lambda t, tmp: t.replace(
            "_target_: megatron.bridge.training.config.ProfilingConfig",
            "_target_: megatron.bridge.training.config.ProfilingConfig\n  _args_: [1]",
        ),
        "profiling._args_",
    ),
    ("alias_bomb", lambda t, tmp: BOMB + t, "expands through YAML aliases"),
    ("oversized", lambda t, tmp: t + "#" * (config_safety.MAX_BYTES + 1), "byte limit"),
]


@pytest.mark.parametrize("name,edit,text", EVIL, ids=[e[0] for e in EVIL])
def test_an_unsafe_config_file_is_refused_naming_the_key(tmp_path, capsys, saved_text, name, edit, text):
    path = tmp_path / "cfg.yaml"
    new = edit(saved_text, tmp_path)
    assert new != saved_text
    path.write_text(new)
    code = main(["--config-file", str(path), "--dry-run", "--world-size", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert text in err and str(path) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml"]  # nothing ran, nothing was written


def test_a_saved_config_passes_the_rules(tmp_path, saved_text):
    path = tmp_path / "cfg.yaml"
    path.write_text(saved_text)
    config_safety.check_text(saved_text)
    assert config_files.load(path).train.train_iters == bridge_recipes.build(SFT).train.train_iters


def test_alias_expansion_is_counted_not_performed():
    """A bomb of 10**9 values is refused at once; an alias that refers to itself too."""
    deep = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(9)
    )
    with pytest.raises(config_safety.UnsafeConfig, match="expands"):
        config_safety.check_text(deep)
    with pytest.raises(config_safety.UnsafeConfig, match="refers to itself"):
        config_safety.check_text("a: &a [1, *a]\n")
    config_safety.check_text("a: &a [1, 2]\nb: *a\n")  # a small alias is fine
