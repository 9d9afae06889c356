"""A fine-tune's answers beside its base model's: what ``scripts/compare_answers.py`` prints.

The tuned model is an export (the merged folder) or the base with an adapter folder on it (PEFT), the
base the Hugging Face folder the run started from; both load in transformers. The prompts are given
(text, or conversation records in a format the row builder reads: everything before the first
assistant reply is the prompt, that reply the reference) or taken from a rows folder: the first
conversations of its validation split (else its training rows), each cut before its first supervised
token, as training saw it, the supervised tokens that follow the reference. Each model answers every
prompt greedily, one model in memory at a time (a GPU holds one 35B model, not two), and the answers
come back side by side.

transformers and torch are imported inside the functions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bridge_recipes.hf.files import CONFIG_FILE, HfCheckpointError

FIRST = 5  # prompts taken from a rows folder unless told


@dataclass
class Prompt:
    """One question: its rendered token ids, what a person reads of it, and the reference reply if known."""

    ids: list[int]
    shown: str
    reference: str | None = None
    answers: dict[str, str] = field(default_factory=dict)


def model_class(folder: Path) -> Any:
    """transformers' auto class of ``folder``: the VL form (a ``vision_config``) loads as image-text-to-text."""
    import transformers

    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise HfCheckpointError(
            f"{folder} has no readable {CONFIG_FILE} ({exc}); pass a Hugging Face folder"
        ) from None
    vl = isinstance(config, dict) and "vision_config" in config
    return transformers.AutoModelForImageTextToText if vl else transformers.AutoModelForCausalLM


def load(folder: Path, device: str, adapter: Path | None = None) -> Any:
    """The model of ``folder`` (with the PEFT ``adapter`` on it) in eval mode: BF16 on a GPU (spread over
    the GPU and the CPU when it does not fit), FP32 on a CPU."""
    import torch

    cls = model_class(folder)
    if device == "cpu":
        model = cls.from_pretrained(str(folder), dtype=torch.float32)
    else:
        model = cls.from_pretrained(str(folder), dtype=torch.bfloat16, device_map="auto")
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    return model.eval()


def text_prompts(tokenizer: Any, texts: list[str], *, thinking: bool = True) -> list[Prompt]:
    """Each text as a user turn, rendered with the chat template and its generation prompt."""
    return [_render(tokenizer, [{"role": "user", "content": t}], t, None, thinking) for t in texts]


def _render(tokenizer: Any, messages: list[dict], shown: str, reference: str | None, thinking: bool) -> Prompt:
    kwargs = {} if thinking else {"enable_thinking": False}
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **kwargs)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return Prompt([int(i) for i in ids], shown, reference)


def record_prompts(tokenizer: Any, file: Path, first: int, *, thinking: bool = True) -> list[Prompt]:
    """The first ``first`` conversation records of a JSON-lines ``file`` (OpenAI, ShareGPT or Alpaca): each
    record's turns before its first assistant reply, that reply the reference."""
    from bridge_recipes.chat.chat_formats import detect, record_format
    from bridge_recipes.chat.chat_template import normalize_conversation
    from bridge_recipes.chat.message_text import MalformedConversation

    out: list[Prompt] = []
    fmt = None
    for index, line in _records(file):
        if len(out) >= first:
            break
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise HfCheckpointError(f"{file} line {index + 1} is not JSON ({exc.args[0]})") from None
        if not isinstance(record, dict):
            raise HfCheckpointError(f"{file} line {index + 1} is a {type(record).__name__}, not a record")
        fmt = fmt or detect([k for k, v in record.items() if v is not None])
        if fmt is None:
            raise HfCheckpointError(f"{file} line {index + 1} fits no conversation format (docs/sft_data.md)")
        try:
            messages, _ = normalize_conversation(record_format(record, fmt).read(record, index)[0], index=index)
        except MalformedConversation as exc:
            raise HfCheckpointError(f"{file} line {index + 1}: {exc}") from None
        at = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        if at == 0:
            continue  # nothing to ask
        reference = messages[at].get("content") if at < len(messages) else None
        asked = messages[:at]
        shown = next((m["content"] for m in reversed(asked) if m["role"] == "user"), str(asked[-1]["content"]))
        out.append(_render(tokenizer, asked, str(shown), reference if isinstance(reference, str) else None, thinking))
    return out


def _records(file: Path) -> Iterator[tuple[int, str]]:
    with open(file, encoding="utf-8") as f:
        for index, line in enumerate(f):
            if line.strip():
                yield index, line


def rows_prompts(folder: Path, first: int) -> tuple[list[Prompt], str]:
    """The first ``first`` conversations of a rows folder's validation split (else its training rows), each
    cut before its first supervised token; and which split they came from."""
    from tokenizers import Tokenizer

    from bridge_recipes.data.inspect_rows import row_conversations
    from bridge_recipes.data.integrity import VAL_DIR, check_rows, tokenizer_json

    split = "validation" if (folder / VAL_DIR).is_dir() else "training"
    loaded = check_rows(folder / VAL_DIR if split == "validation" else folder)
    m = loaded.manifest
    if m["packing"] == "eos_joined":
        raise HfCheckpointError(
            f"{folder} holds eos_joined rows, cut from one stream: they keep no conversation whole to ask; give "
            "--prompts FILE or --prompt TEXT"
        )
    tok = Tokenizer.from_file(str(tokenizer_json(m.get("tokenizer") or "")))
    out: list[Prompt] = []
    for r in range(len(loaded.ids)):
        cu = None if loaded.cu is None else loaded.cu[r]
        for ids, mask in row_conversations(loaded.ids[r], loaded.mask[r], cu, m["packing"], m.get("eos_token_id", 0)):
            trained = [i for i, v in enumerate(mask.tolist()) if v]
            if not trained or len(out) >= first:
                continue
            start = trained[0]
            end = next((i for i in range(start, len(mask)) if not mask[i]), len(mask))
            prompt = [int(i) for i in ids[:start]]
            shown = last_user_turn(tok.decode(prompt, skip_special_tokens=False))
            out.append(Prompt(prompt, shown, tok.decode(ids[start:end].tolist())))
        if len(out) >= first:
            break
    return out, split


def last_user_turn(rendered: str) -> str:
    """What a person reads of a rendered prompt: its last user turn (the whole text when it has none)."""
    from bridge_recipes.chat.chat_template import END_OF_TURN, USER_HEADER

    at = rendered.rfind(USER_HEADER)
    return rendered if at < 0 else rendered[at + len(USER_HEADER) :].split(END_OF_TURN, 1)[0]


def answer(model: Any, tokenizer: Any, prompts: list[Prompt], name: str, max_new_tokens: int,
           progress: Callable[[str], None] = lambda line: None) -> None:  # fmt: skip
    """``model``'s greedy answer to each prompt, stored under ``name``."""
    import torch

    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    for k, p in enumerate(prompts):
        ids = torch.tensor([p.ids], device=device)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=eos,
            )
        p.answers[name] = tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True)
        progress(f"{name}: {k + 1}/{len(prompts)} answered")


def side_by_side(prompts: list[Prompt], names: tuple[str, ...]) -> str:
    """The prompts and each model's answer, one block a prompt."""
    lines: list[str] = []
    for k, p in enumerate(prompts):
        lines += ["", f"=== prompt {k + 1} ===", p.shown.strip()]
        for name in names:
            lines += [f"--- {name} ---", p.answers.get(name, "").strip()]
        if p.reference is not None:
            lines += ["--- reference (the training data's reply) ---", p.reference.strip()]
    return "\n".join(lines)


def write_jsonl(prompts: list[Prompt], out: str | os.PathLike) -> None:
    with open(out, "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({k: v for k, v in asdict(p).items() if k != "ids"}, ensure_ascii=False) + "\n")


def parser() -> Any:
    import argparse

    from bridge_recipes.utils import quiet

    p = argparse.ArgumentParser(
        prog="compare_answers.py",
        description="A fine-tune's answers beside its base model's (transformers; greedy; one model in memory at "
        "a time).",
    )
    quiet.add_flag(p)
    p.add_argument("--base", required=True, metavar="DIR", help="the Hugging Face folder the run started from")
    tuned = p.add_mutually_exclusive_group(required=True)
    tuned.add_argument("--export", metavar="DIR", help="the merged export (run_recipe.py --export-hf DIR)")
    tuned.add_argument("--adapter", metavar="DIR", help="an adapter folder (DIR-adapter), put on --base with PEFT")
    asked = p.add_mutually_exclusive_group(required=True)
    asked.add_argument("--prompt", action="append", metavar="TEXT", help="a user turn to answer (repeatable)")
    asked.add_argument(
        "--prompts", metavar="FILE", help="JSON lines of conversations: each asked up to its first reply"
    )
    asked.add_argument("--rows", metavar="DIR", help="a rows folder: its first validation conversations")
    p.add_argument("--first", type=int, default=FIRST, metavar="N", help=f"prompts from --prompts/--rows ({FIRST})")
    p.add_argument("--max-new-tokens", type=int, default=256, metavar="N")
    p.add_argument("--no-thinking", action="store_true", help="render prompts with enable_thinking=false")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: a GPU when there is one")
    p.add_argument("--out", metavar="FILE", help="also write the prompts and answers as JSON lines (a new file)")
    return p


def _checked(args: Any) -> list[str]:
    """What is wrong with the arguments before any model loads (each names the option and the fix)."""
    problems = []
    for option in ("base", "export", "adapter", "rows"):
        value = getattr(args, option)
        if value is not None and not Path(value).expanduser().is_dir():
            problems.append(f"--{option} {value}: no such folder")
    if args.adapter and not (Path(args.adapter).expanduser() / "adapter_config.json").is_file():
        problems.append(f"--adapter {args.adapter}: no adapter_config.json (pass the DIR-adapter folder of an export)")
    if args.prompts and not Path(args.prompts).expanduser().is_file():
        problems.append(f"--prompts {args.prompts}: no such file")
    if args.first < 1 or args.max_new_tokens < 1:
        problems.append("--first and --max-new-tokens take a number >= 1")
    if args.out and Path(args.out).expanduser().exists():
        problems.append(f"--out {args.out} exists; choose a new file (it is never written over)")
    return problems


def main(argv: list[str] | None = None) -> int:
    import sys

    args = parser().parse_args(argv)
    if problems := _checked(args):
        for line in problems:
            print(f"compare_answers.py: error: {line}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoTokenizer

    def say(line: str) -> None:
        print(f"[compare_answers] {line}", file=sys.stderr, flush=True)

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    base = Path(args.base).expanduser()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(base))
        if args.rows:
            prompts, split = rows_prompts(Path(args.rows).expanduser(), args.first)
            say(f"{len(prompts)} prompt(s): the first conversations of the {split} rows of {args.rows}")
        elif args.prompts:
            prompts = record_prompts(
                tokenizer, Path(args.prompts).expanduser(), args.first, thinking=not args.no_thinking
            )
        else:
            prompts = text_prompts(tokenizer, args.prompt, thinking=not args.no_thinking)
        if not prompts:
            raise HfCheckpointError("no prompt to ask: the input holds no conversation with a user turn")
        names = ("base", "fine-tuned")
        say(f"loading {base} on the {device}")
        model = load(base, device)
        answer(model, tokenizer, prompts, names[0], args.max_new_tokens, say)
        if args.adapter:
            from peft import PeftModel

            say(f"putting the adapter {args.adapter} on it")
            model = PeftModel.from_pretrained(model, str(Path(args.adapter).expanduser())).eval()
        else:
            del model
            say(f"loading {args.export} on the {device}")
            model = load(Path(args.export).expanduser(), device)
        answer(model, tokenizer, prompts, names[1], args.max_new_tokens, say)
    except HfCheckpointError as exc:
        print(f"compare_answers.py: error: {exc}", file=sys.stderr)
        return 2
    print(side_by_side(prompts, names))
    if args.out:
        write_jsonl(prompts, Path(args.out).expanduser())
        say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
