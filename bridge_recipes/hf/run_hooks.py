"""The runner's side of Hugging Face checkpoints (``run_recipe.py --hf-checkpoint / --export-hf``).

- :func:`check_family` and :func:`take_shape` (before the scale-down and the overrides): the
  folder must be a checkpoint of the recipe's model family, and its ``config.json`` (read by
  Megatron-Bridge's ``AutoBridge``) decides the model's shape (:data:`architecture.SHAPE_FIELDS`),
  so a toy or scaled checkpoint needs no ``model.*`` overrides; the recipe keeps its policy.
- :func:`use_checkpoint` (before the KEY=VALUE overrides): makes the folder's
  tokenizer the run's (Megatron-Bridge ``HuggingFaceTokenizer`` with ``tokenizer_model=DIR``,
  so vocabulary, EOS and pad come from it), for a VL checkpoint its processor the VL dataset's
  (``hf_processor_path``), and the HF template of Megatron-Bridge's own
  ``also_save_hf_checkpoint`` (``checkpoint.hf_source_path``).
- A released folder (the VL form people download) given to a text recipe gives its language
  model and MTP layer (:mod:`bridge_recipes.hf.released`): imported as the text model, the vision
  tower kept out of training memory and carried into the export unchanged (:func:`released_summary`).
- :func:`check_model` (after the overrides): the folder's architecture must be the recipe's
  model as configured (``model.*`` overrides included), or its weights cannot load.
- :func:`attach` (at launch): converts once into the cache (:func:`importer.cached_import`;
  rank 0 converts in a child process, the other ranks wait for the folder to appear) and sets
  ``checkpoint.pretrained_checkpoint``, so an SFT/PEFT recipe runs through ``finetune()``.
- :func:`export_after_training` (rank 0, after training): the newest checkpoint of
  ``checkpoint.save`` to a HF folder, in a child process.

Conversions run in child processes because the training process's environment belongs to
torchrun (its rendezvous address and ranks), while a conversion runs as one process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bridge_recipes.hf import architecture, exporter, importer
from bridge_recipes.hf import checkpoint as ck
from bridge_recipes.hf.files import EXPORT_FAILED, AdapterExportError, HfCheckpointError

LOG = "[run_recipe]"
WAIT_S = 3600  # longest wait of the other ranks for rank 0's conversion (a 397B import takes long)
FAILED_SUFFIX = ".failed"
_TORCHRUN_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
)


def _log(msg: str) -> None:
    print(f"{LOG} {msg}", flush=True)


def inspect(hf_dir: str) -> ck.HfFolder:
    """The checked Hugging Face folder ``hf_dir``. Raises ValueError (exit 2) on bad input."""
    try:
        return ck.inspect_folder(hf_dir)
    except HfCheckpointError as e:
        raise ValueError(f"hf_checkpoint: {e}") from None


def text_model(cfg: Any) -> bool:
    """Whether ``cfg`` trains a text model (a released VL folder then gives its language model)."""
    from bridge_recipes.models.qwen35 import is_vlm

    return not is_vlm(cfg)


def found_for(cfg: Any, folder: ck.HfFolder) -> dict[str, Any]:
    """The folder's compared fields as the recipe takes it (a text recipe: a VL folder's language model)."""
    return architecture.found_fields(folder, as_text=architecture.takes_language_model(folder, not text_model(cfg)))


def check_family(cfg: Any, folder: ck.HfFolder, *, sized: bool = False) -> None:
    """The folder must hold the recipe's model family (:data:`checkpoint.FAMILY_FIELDS`: model
    class, attention interval, head dimensions, ...), and with ``sized`` (no scale-down) the size
    of the recipe's model too; a released VL folder given to a text recipe must hold its vision
    tower and MTP layer. ValueError naming each differing field and the fix."""
    found, expected = found_for(cfg, folder), architecture.expected_from_model(cfg.model, not text_model(cfg))
    if problems := architecture.check_against(found, expected, scaled=True):
        raise ValueError(
            f"hf_checkpoint={folder.path} is not of this recipe's model family: {'; '.join(problems)}. "
            "Choose a recipe of its family (run_recipe.py --list) or a checkpoint of the recipe's"
        )
    if architecture.takes_language_model(folder, not text_model(cfg)):
        from bridge_recipes.hf.released import released_problem

        if problem := released_problem(folder):
            raise ValueError(f"hf_checkpoint: {problem}")
    if sized and (problems := architecture.check_against(found, expected)):
        layers = found["num_hidden_layers"]
        raise ValueError(
            f"hf_checkpoint={folder.path} is not the size of this recipe's model: {'; '.join(problems)}. "
            f"Choose the recipe of its size (run_recipe.py --list), or for a toy or scaled-down checkpoint add "
            f"--scale-down {layers} (its layer count)"
        )


def layers_and_experts(folder: ck.HfFolder) -> tuple[int, int | None]:
    """The checkpoint's decoder layers and routed experts (None for a dense model)."""
    found = architecture.found_fields(folder)
    return found["num_hidden_layers"], found["num_experts"]


def take_shape(cfg: Any, folder: ck.HfFolder) -> list[str]:
    """Set ``cfg.model``'s architecture fields (:data:`architecture.SHAPE_FIELDS`) to what Megatron-Bridge's
    provider for the folder has, and a VL model's vision token ids to the folder's config.json (top level
    or text_config); returns the changes as ``model.FIELD: old -> new``."""
    provider = architecture.provider_of(folder, text_model(cfg))
    changes = []
    for name in architecture.SHAPE_FIELDS:
        if not hasattr(cfg.model, name) or not hasattr(provider, name):
            continue
        old, new = getattr(cfg.model, name), getattr(provider, name)
        if old == new:
            continue
        setattr(cfg.model, name, new)
        if hasattr(new, "to_dict") and hasattr(old, "to_dict"):  # a sub-config (the vision tower): its fields
            a, b = old.to_dict(), new.to_dict()
            keys = [k for k in b if k != "transformers_version" and a.get(k) != b[k]]
            changes += [f"model.{name}.{k}: {a.get(k)!r} -> {b[k]!r}" for k in keys]
        elif name == "linear_attention_freq":
            changes.append(f"model.{name}: {len(old)} layers -> {len(new)} layers")
        else:
            changes.append(f"model.{name}: {old!r} -> {new!r}")
    try:
        token_ids = architecture.vision_token_ids(folder)
    except HfCheckpointError as e:
        raise ValueError(f"hf_checkpoint: {e}") from None
    for name, new in token_ids.items():  # a VL dataset built with the folder's processor writes these ids
        if hasattr(cfg.model, name) and getattr(cfg.model, name) != new:
            changes.append(f"model.{name}: {getattr(cfg.model, name)!r} -> {new!r}")
            setattr(cfg.model, name, new)
    return changes


def use_checkpoint(cfg: Any, folder: ck.HfFolder) -> None:
    """Make the checked folder's tokenizer the run's (and, for a VL checkpoint with an image
    processor, its processor the VL dataset's)."""
    from megatron.bridge.training.tokenizers.config import TokenizerConfig

    from bridge_recipes.vl.vl_processor import IMAGE_PROCESSOR_FILES

    cfg.tokenizer = TokenizerConfig(tokenizer_type=HF_TOKENIZER, tokenizer_model=str(folder.path))
    cfg.checkpoint.hf_source_path = str(folder.path)
    if folder.is_vl and any((folder.path / f).is_file() for f in IMAGE_PROCESSOR_FILES):
        # a VL checkpoint's images go through its own processor, as its text through its tokenizer
        for holder in (cfg.dataset, getattr(cfg.dataset, "task_encoder", None)):
            if holder is not None and getattr(holder, "hf_processor_path", None) is not None:
                holder.hf_processor_path = str(folder.path)


HF_TOKENIZER = "HuggingFaceTokenizer"  # Megatron-Bridge's tokenizer type of a Hugging Face folder
# The fields that name a tokenizer besides the checkpoint's own (use_checkpoint sets the first to the folder).
TOKENIZER_FIELDS = (("tokenizer", "tokenizer_model"), ("dataset", "tokenizer_path"))


def tokenizer_problem(cfg: Any, folder: ck.HfFolder) -> str | None:
    """A tokenizer field (:data:`TOKENIZER_FIELDS`) set to another tokenizer than the folder's own: the
    checkpoint's weights would train on another tokenizer's ids (its embedding rows mean its own
    tokens). A folder or file whose tokenizer.json is the same bytes is the same tokenizer."""
    from bridge_recipes.data.integrity import tokenizer_json
    from bridge_recipes.utils.outputs import file_sha256

    own = folder.path / ck.TOKENIZER_FILES[0]
    kind = getattr(getattr(cfg, "tokenizer", None), "tokenizer_type", None)
    if kind not in (None, HF_TOKENIZER):
        return (
            f"tokenizer.tokenizer_type={kind}: the run's tokenizer is the --hf-checkpoint folder's own "
            f"({HF_TOKENIZER} on {folder.path}), the one its weights were trained on; drop tokenizer.tokenizer_type"
        )
    for section, name in TOKENIZER_FIELDS:
        value = getattr(getattr(cfg, section, None), name, None)
        if value is None or not str(value):
            continue
        path = Path(str(value)).expanduser()
        if path.exists() and path.resolve() in (folder.path, own):
            continue
        key = f"{section}.{name}={value}"
        fix = (
            f"drop {section}.{name} (the run reads the checkpoint's own tokenizer), or pass the checkpoint of that "
            "tokenizer as --hf-checkpoint"
        )
        given = tokenizer_json(path) if path.exists() else None
        if given is None or not given.is_file():
            return (
                f"{key} names no local tokenizer.json to compare with the one of --hf-checkpoint {folder.path}, "
                f"whose weights were trained on its own tokenizer; {fix}"
            )
        if file_sha256(given) != file_sha256(own):
            return (
                f"{key}: its tokenizer.json differs from the one of --hf-checkpoint {folder.path}: the checkpoint's "
                f"weights would train on another tokenizer's ids; {fix}"
            )
    return None


def check_model(cfg: Any, folder: ck.HfFolder) -> None:
    """The folder's architecture against ``cfg.model`` after the overrides (the shape came from the
    folder, so only a ``model.*`` override can differ), and its tokenizer against a tokenizer override
    (:func:`tokenizer_problem`); ValueError naming each differing field."""
    if problem := tokenizer_problem(cfg, folder):
        raise ValueError(f"hf_checkpoint: {problem}")
    problems = architecture.check_against(
        found_for(cfg, folder), architecture.expected_from_model(cfg.model, not text_model(cfg))
    )
    if problems:
        overridden = [
            f"model.{architecture.MODEL_FIELD_OF[p.split(':')[0]]}"
            for p in problems
            if p.split(":")[0] in architecture.MODEL_FIELD_OF
        ]
        hint = f"; drop the override(s) of {', '.join(overridden)}" if overridden else ""
        raise ValueError(
            f"hf_checkpoint={folder.path}: its weights would not load into the model as overridden: "
            + "; ".join(problems)
            + f"{hint} (the model's shape comes from the checkpoint's config.json)"
        )


def cache_folder(folder: ck.HfFolder, text: bool = False) -> Path:
    """Where the launch converts ``folder`` to (``text``: for a text recipe)."""
    return importer.cache_root() / importer.cache_key(folder, text)


def released_summary(cfg: Any, folder: ck.HfFolder) -> str | None:
    """What a text recipe takes from a released VL folder and what its export carries through
    unchanged, or None when the recipe takes the whole folder."""
    if not architecture.takes_language_model(folder, not text_model(cfg)):
        return None
    from bridge_recipes.hf.released import parts

    p = parts(folder)
    return (
        f"taken: the language model ({p.language} tensors) and its MTP layer ({p.mtp} tensors) as the text "
        f"model; carried through unchanged: the vision tower ({p.vision} tensors, {p.vision_bytes / 2**20:,.1f} MiB, "
        "never in training memory), its vision_config, the config, tokenizer, chat template and processor "
        "files, into the export (the released form)"
    )


def random_init_warning(cfg: Any, task: str, hf_checkpoint: str | None) -> str | None:
    """The warning for an SFT/PEFT run with no weights to start from (the runner refuses a LoRA one)."""
    if task not in ("sft", "peft") or hf_checkpoint or cfg.checkpoint.pretrained_checkpoint:
        return None
    if task == "peft" and getattr(cfg, "peft", None) is not None:
        return (
            "a LoRA run needs base weights to put its adapters on, and none are named: pass --hf-checkpoint DIR "
            "(a Hugging Face folder, converted once and cached) or checkpoint.pretrained_checkpoint=DIR (a Megatron "
            "checkpoint from scripts/convert_checkpoint.py import); to time a LoRA recipe on random weights, "
            "--lora-from-random-init (benchmark only)"
        )
    return (
        f"WARNING: this {task} recipe has no pretrained weights: it would train from random initialization. "
        "Pass hf_checkpoint=DIR (a Hugging Face folder, converted once and cached) or "
        "checkpoint.pretrained_checkpoint=DIR (a Megatron checkpoint from scripts/convert_checkpoint.py import)."
    )


def child_env() -> dict[str, str]:
    """The environment of a conversion child: torchrun's variables removed. Kept, the child's
    one-process group would join torchrun's rendezvous; TORCHELASTIC_USE_AGENT_STORE=True alone
    makes it wait, as a client, for a store that nobody hosts."""
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_ENV and not k.startswith("TORCHELASTIC_")}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def attach(cfg: Any, folder: ck.HfFolder) -> Path:
    """Convert (once) and point ``checkpoint.pretrained_checkpoint`` at the conversion."""
    text = text_model(cfg)
    target = cache_folder(folder, text)
    failed = target.with_name(target.name + FAILED_SUFFIX)
    if not (target.is_dir() and ck.is_megatron_checkpoint(target)):
        if _rank() == 0:
            failed.unlink(missing_ok=True)
            _log(f"hf checkpoint: converting {folder.path} -> {target} (once; reused while the folder is unchanged)")
            cmd = [sys.executable, "-m", "bridge_recipes.hf.run_hooks", "import", str(folder.path), str(target)]
            cmd += [TEXT_MODEL_FLAG] if text else []
            rc = subprocess.run(cmd, env=child_env()).returncode
            if rc != 0:
                failed.parent.mkdir(parents=True, exist_ok=True)
                failed.write_text(f"exit status {rc}\n")
                raise SystemExit(f"{LOG} hf checkpoint: the conversion of {folder.path} failed (exit status {rc})")
        else:
            deadline = time.monotonic() + WAIT_S
            while not (target.is_dir() and ck.is_megatron_checkpoint(target)):
                if failed.exists() or time.monotonic() > deadline:
                    raise SystemExit(f"{LOG} hf checkpoint: rank 0's conversion into {target} failed or timed out")
                time.sleep(2)
    else:
        _log(f"hf checkpoint: reusing the conversion in {target}")
    cfg.checkpoint.pretrained_checkpoint = str(target)
    return target


def check_export_target(cfg: Any, out: str, folder: ck.HfFolder | None = None, *, text_only: bool = False) -> None:
    """--export-hf needs a save folder (the export reads the final checkpoint) and a free, writable
    --export-hf apart from every folder the run reads or writes, the checkpoints' and the rows'
    included; a LoRA run's adapter folder beside it likewise; --export-text-only needs a text
    recipe trained from a released VL ``folder`` (checked at the dry run, not after training)."""
    from bridge_recipes.hf.released import TEXT_ONLY_OPTION, adapter_folder
    from bridge_recipes.utils.outputs import overlap_problem

    ckpt = cfg.checkpoint
    if not ckpt.save:
        raise ValueError("export_hf needs checkpoint.save (the export reads the run's final checkpoint)")
    if text_only and not (folder is not None and architecture.takes_language_model(folder, not text_model(cfg))):
        what = (
            "a VL recipe exports the VL form"
            if not text_model(cfg)
            else "the --hf-checkpoint is the text form already"
        )
        raise ValueError(
            f"{TEXT_ONLY_OPTION} is for a text recipe trained from a released (VL) folder; {what}: "
            f"drop {TEXT_ONLY_OPTION}"
        )
    data = getattr(getattr(cfg, "dataset", None), "path", None)
    folders = [
        ("checkpoint.save", ckpt.save),
        ("checkpoint.load", ckpt.load),
        ("checkpoint.pretrained_checkpoint", ckpt.pretrained_checkpoint),
        ("hf_checkpoint", getattr(ckpt, "hf_source_path", None)),
        ("dataset.path (the rows)", data if isinstance(data, str) else None),
    ]
    targets = [(Path(out).expanduser(), f"export_hf {Path(out).expanduser()}")]
    if getattr(cfg, "peft", None) is not None:  # a LoRA run's adapters go to a folder of their own beside it
        targets.append((adapter_folder(out), f"the adapter folder {adapter_folder(out)} beside --export-hf"))
    for path, what in targets:
        if path.exists() and not path.is_dir():
            raise ValueError(f"{what} is a file; choose a new folder (another --export-hf)")
        if path.is_dir() and (held := sorted(p.name for p in path.iterdir())):
            raise ValueError(
                f"{what} exists and is not empty (it holds {', '.join(held[:5])}); the export writes a new folder "
                "there and replaces none: move its files away, or choose another --export-hf"
            )
        inputs = [(n, p) for n, p in folders if p]
        if problem := overlap_problem(path, option="export_hf", inputs=inputs, what=what):
            raise ValueError(problem)
        existing = next(p for p in (path, *path.absolute().parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(f"{what}: {existing} is not a writable folder; choose a folder you can write")


def export_summary(cfg: Any, out: str, folder: ck.HfFolder, text_only: bool = False) -> str:
    """The summary's export line: the form the export takes, and a LoRA run's adapter folder."""
    from bridge_recipes.hf.released import adapter_folder

    if architecture.takes_language_model(folder, not text_model(cfg)):
        form = (
            "the text form (--export-text-only)"
            if text_only
            else f"the released form of {folder.config.get('architectures', ['?'])[0]}: the fine-tuned language "
            "model and MTP layer, the vision tower and config unchanged"
        )
    else:
        form = f"the form of {folder.path.name}"
    line = f"{out} (a Hugging Face folder after training, {form})"
    if getattr(cfg, "peft", None) is not None:
        line += f"; adapters alone (PEFT) in {adapter_folder(out)}"
    return line


def retry_command(cfg: Any, recipe: str, out: str, template: str, *, text_only: bool, scaled: bool) -> str:
    """The one command that exports the run's saved checkpoint again, as the run would have
    (``scripts/convert_checkpoint.py export``, by module: it runs from any folder)."""
    import shlex

    from bridge_recipes.hf.released import TEXT_ONLY_OPTION

    cmd = ["python", "-m", "bridge_recipes.hf.cli", "export", "--megatron", str(cfg.checkpoint.save)]
    cmd += ["--hf-template", template, "--recipe", recipe, "--out", out]
    cmd += ["--scaled"] if scaled else []
    cmd += [TEXT_ONLY_OPTION] if text_only else []
    cmd += ["--overwrite"] if Path(out).expanduser().exists() else []  # a folder this export wrote
    return shlex.join(cmd)


def export_after_training(
    cfg: Any, out: str, template: str, text_only: bool = False, *, recipe: str, scaled: bool = False
) -> int:
    """Rank 0: the final checkpoint of ``checkpoint.save`` to a HF folder at ``out`` (a LoRA run's
    adapters also beside it), in a child process; exit status. A failed export ends with one
    message: what failed (the child's line above it), that the checkpoint is safe, and the command
    that retries the export alone (:data:`EXPORT_FAILED`)."""
    if _rank() != 0:
        return 0
    _log(f"export: {cfg.checkpoint.save} -> {out} (config and tokenizer from {template})")
    cmd = [sys.executable, "-m", "bridge_recipes.hf.run_hooks", "export", cfg.checkpoint.save, template, out]
    cmd += [TEXT_MODEL_FLAG] if text_model(cfg) else []
    cmd += [TEXT_ONLY_FLAG] if text_only else []
    rc = subprocess.run(cmd, env=child_env()).returncode
    if rc == 0:
        return 0
    from bridge_recipes.training.saved_runs import latest_iteration

    step = latest_iteration(cfg.checkpoint.save)
    retry = retry_command(cfg, recipe, out, template, text_only=text_only, scaled=scaled)
    print(
        f"{LOG} error: training finished but its export did not (exit status {rc}, the reason above). The trained "
        f"checkpoint is safe in {cfg.checkpoint.save}" + (f" (step {step})" if step is not None else "") + ".\n"
        f"{LOG} export it again, alone: {retry}",
        file=sys.stderr,
        flush=True,
    )
    return EXPORT_FAILED


TEXT_MODEL_FLAG = "--text-model"  # the child converts for a text recipe
TEXT_ONLY_FLAG = "--text-only"  # the child exports the text form


def main(argv: list[str] | None = None) -> int:
    """``python -m bridge_recipes.hf.run_hooks import HF OUT [--text-model] | export MEGATRON TEMPLATE OUT
    [--text-model] [--text-only]`` (the runner's child processes; the checks ran before)."""
    argv = sys.argv[1:] if argv is None else argv
    flags = {a for a in argv if a.startswith("--")}
    args = [a for a in argv if not a.startswith("--")]
    text = TEXT_MODEL_FLAG in flags
    try:
        if args[:1] == ["import"] and len(args) == 3 and flags <= {TEXT_MODEL_FLAG}:
            importer.import_checkpoint(args[1], args[2], overwrite=True, text_model=text)
        elif args[:1] == ["export"] and len(args) == 4 and flags <= {TEXT_MODEL_FLAG, TEXT_ONLY_FLAG}:
            exporter.export_checkpoint(args[1], args[2], args[3], text_model=text, text_only=TEXT_ONLY_FLAG in flags)
        else:
            print(
                "usage: python -m bridge_recipes.hf.run_hooks import HF OUT [--text-model] | "
                "export MEGATRON TEMPLATE OUT [--text-model] [--text-only]"
            )
            return 2
    except HfCheckpointError as e:
        print(f"{LOG} error: {e}", file=sys.stderr)
        return 2
    except AdapterExportError as e:
        print(f"{LOG} export: {e}", file=sys.stderr)
        return EXPORT_FAILED
    except Exception as e:  # inside Megatron-Bridge, transformers or the disk: one line, the stack in a file
        print(f"{LOG} export failed: {type(e).__name__}: {e} (stack: {stack_file(e)})", file=sys.stderr)
        return 1
    return 0


def stack_file(error: BaseException) -> str:
    """A temporary file holding ``error``'s Python stack, for a report of a failure that is not bad input."""
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix="qwen35-recipes-export-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write("".join(traceback.format_exception(error)))
    return path


if __name__ == "__main__":
    sys.exit(main())
