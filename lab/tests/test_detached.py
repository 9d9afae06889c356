"""lab/gpu/detached.sh: a queue runs detached, step after step (a failure does not stop it),
and `wait` packs what it wrote into $OUT."""

import os
import re
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "lab/gpu/detached.sh"


def _sh(*args, env, timeout=60):
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd="/", env=env, capture_output=True, text=True, timeout=timeout
    )


def test_queue_runs_detached_and_wait_collects(tmp_path):
    env = {
        **os.environ,
        "DETACHED_DIR": str(tmp_path / "d"),
        "DETACHED_SETUP": "export GREETING=hi",
        "OUT": str(tmp_path / "out"),
    }
    queue = tmp_path / "queue"
    queue.write_text(
        "# a comment\n"
        "echo $GREETING > $OUT/first.txt; pwd\n\n"
        "echo failing; exit 3\n"
        "sleep 1; printf part > $OUT/jit.tar.xz.00\n"
    )
    start = _sh("start", str(queue), env=env)
    assert start.returncode == 0 and "3 step(s) started" in start.stdout, start.stderr
    again = _sh("start", str(queue), env=env)  # the queue is still running (the last step sleeps)
    assert again.returncode == 2 and "still running" in again.stderr
    done = _sh("wait", "30", env=env)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("detached.sh: done"), done.stdout
    status = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("20")]
    assert [s.split(":")[0] for s in status] == ["start", "rc 0", "start", "rc 3", "start", "rc 0"]
    with tarfile.open(tmp_path / "out/detached.tgz") as tar:
        names = set(tar.getnames())
        assert {"status.log", "out/first.txt", "out/step_01.out", "out/step_02.out"} <= names
        assert "out/jit.tar.xz.00" not in names  # kernel-cache parts travel as separate files
        assert tar.extractfile("out/first.txt").read() == b"hi\n"
        assert tar.extractfile("out/step_01.out").read().decode().strip() == str(ROOT)  # steps run from the repo
        assert tar.extractfile("out/step_02.out").read() == b"failing\n"
    assert (tmp_path / "out/jit.tar.xz.00").read_text() == "part"


def test_several_queues_run_one_after_the_other(tmp_path):
    env = {**os.environ, "DETACHED_DIR": str(tmp_path / "d"), "DETACHED_SETUP": "true", "OUT": str(tmp_path / "o")}
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("# first\necho one >> $OUT/order.txt")  # no final newline
    second.write_text("echo two >> $OUT/order.txt\n")
    start = _sh("start", str(first), str(second), env=env)
    assert start.returncode == 0 and "2 step(s) started" in start.stdout, start.stderr
    assert _sh("wait", "30", env=env).stdout.rstrip().endswith("detached.sh: done")
    with tarfile.open(tmp_path / "o/detached.tgz") as tar:
        assert tar.extractfile("out/order.txt").read() == b"one\ntwo\n"
    assert _sh("start", str(first), str(tmp_path / "missing"), env=env).returncode == 2


def test_bad_use_exits_2(tmp_path):
    env = {**os.environ, "DETACHED_DIR": str(tmp_path / "d")}
    assert _sh("start", str(tmp_path / "missing"), env=env).returncode == 2
    assert _sh("wait", "1", env=env).returncode == 2  # nothing started
    assert _sh("bogus", env=env).returncode == 2


def test_committed_queues_name_existing_recipes_and_scripts():
    """A typo in a queue would cost a lease's device time: every recipe and file a queue names exists."""
    import re
    import shlex

    from bridge_recipes.recipes import registry
    from lab.candidates import find

    queues = sorted((ROOT / "lab/gpu/queues").glob("*.txt"))
    assert queues
    for queue in queues:
        steps = _queue_steps(queue)
        assert steps, queue
        for step in steps:
            words = shlex.split(step)
            for flag in ("--recipe", "--against"):
                if flag in words:
                    registry.find(words[words.index(flag) + 1])  # raises for an unknown name
            if "--candidate" in words:
                find(words[words.index("--candidate") + 1])  # raises for an unknown candidate
            for word in words:
                if re.fullmatch(r"(scripts|tests)/[\w/.-]+\.(py|sh)", word):
                    assert (ROOT / word).is_file(), f"{queue.name}: {word}"


def _queue_steps(queue):
    return [s for s in queue.read_text().splitlines() if s.strip() and not s.lstrip().startswith("#")]


SHELL_OPERATORS = {"&&", "||", ";", "|", ">", ">>", "2>", "&"}


def _queued_benchmarks(out: str = "$OUT"):
    """(queue file name, step, parsed options) of each benchmark line (scripts/benchmark.py, or the lab's
    python -m lab.benchmark) of every queue, with ``$OUT`` replaced by ``out``."""
    import shlex

    from bridge_recipes.bench.benchmark import build_parser as product_parser
    from lab.benchmark import build_parser as lab_parser

    parsers = {"scripts/benchmark.py": product_parser(), "lab.benchmark": lab_parser()}
    for queue in sorted((ROOT / "lab/gpu/queues").glob("*.txt")):
        for step in _queue_steps(queue):
            words = shlex.split(step.replace("$OUT", out))
            for command, parser in parsers.items():
                if command in words:
                    args = words[words.index(command) + 1 :]
                    # the command's own words: up to the next shell operator of the line
                    ends = [i for i, w in enumerate(args) if w in SHELL_OPERATORS]
                    yield queue.name, step, parser.parse_intermixed_args(args[: ends[0]] if ends else args)


def _make_what_it_makes(line: str, tokenizer: Path, built: set[tuple[str, ...]]) -> None:
    """The folders a queue line makes (``mkdir -p``) and the rows it builds (``make_lognormal_rows.py``,
    each set once), as the line would before its run."""
    import shlex

    from bridge_recipes.data.synthetic_chat import build_lognormal_rows, build_long_split_rows

    for part in line.split("&&"):
        words = shlex.split(part)
        if words[:2] == ["mkdir", "-p"]:
            for folder in words[2:]:
                Path(folder).mkdir(parents=True, exist_ok=True)
        if "lab/gpu/make_lognormal_rows.py" not in words or tuple(words) in built:
            continue
        built.add(tuple(words))
        args = words[words.index("lab/gpu/make_lognormal_rows.py") + 1 :]
        split = "--long-split" in args
        rest = [a for a in args if a != "--long-split"]
        out, row = Path(rest[0]), int(rest[1]) if len(rest) > 1 else 8192
        if split:
            build_long_split_rows(out / "long_split", tokenizer, row_tokens=row)
            continue
        for packing in ("boundaries", "one_per_row") if len(rest) == 1 else ("boundaries",):
            build_lognormal_rows(out / packing, tokenizer, packing, row_tokens=row)


def test_full_scale_benchmarks_in_a_queue_fit_a_lease():
    """A full-scale benchmark's steps (both recipes' with --against, at the global batch its
    overrides set) take at most 10 minutes at the published or measured rates, so 30 minutes of device time holds two
    with their start-ups; each measures a window of 2+ steps after step 2; a pair trains one model
    on the same rows, so that its loss curves are compared."""
    from bridge_recipes.bench.harness import build_config, different_training, published_step_seconds
    from bridge_recipes.recipes import registry
    from lab.benchmark import runs_of

    checked = 0
    for queue, step, opts in _queued_benchmarks():
        if opts.proxy_layers:
            continue
        steps, (first, last) = opts.steps, opts.window
        assert 3 <= first < last <= steps, f"{queue}: window {first}-{last} of {steps} steps: {step}"
        rates, cfgs = [], []
        for _, name, own in runs_of(opts):  # a candidate runs with its published policy, in one command
            entry = registry.find(name)
            rows = {"dataset": "sft-rows", "overrides": [f"dataset.path={opts.rows}"]} if opts.rows else {}
            # the command's overrides, then the run's own, in scripts/benchmark.py's order
            cfgs.append(
                build_config(entry.name, **{**rows, "overrides": [*rows.get("overrides", []), *opts.overrides, *own]})
            )
            rates.append(published_step_seconds(cfgs[-1], entry))
        # a line under lab/gpu/watch.sh is ended at its limit, which bounds it whatever its rate
        watched = re.search(r"\bLIMIT=(\d+) .*lab/gpu/watch\.sh", step)
        # an arm with no rate of its own (a variant of the other arm) is sized by the slower known one
        known = [s for s in rates if s]
        if watched:
            assert int(watched.group(1)) <= 900, f"{queue}: a watch of over 15 minutes: {step}"
        else:
            assert known, f"{queue}: no arm has a published or measured rate to size its steps by: {step}"
            seconds = sum(steps * (s or max(known)) for s in rates)
            assert seconds <= 600, f"{queue}: {seconds / 60:.1f} min of steps: {step}"
        if len(cfgs) == 2:  # a pair is queued for its loss curves: one model on the same rows
            assert different_training(*cfgs) is None, f"{queue}: {step}"
        checked += 1
    assert checked >= 8  # the 8-GPU queue's five benchmarks, two convergence pairs and a candidate


def test_every_queued_benchmark_passes_the_argument_checks(tmp_path):
    """Each benchmark line of every queue gets past the checks benchmark.py makes before a run
    starts (recipes, overrides, proxy size, candidates, value ranges, the output folder), so no
    lease spends its device time on a line that stops at once."""

    from bridge_recipes.bench.benchmark import argument_problems, gpus_of
    from bridge_recipes.runner.problems import megatron_validation
    from lab.benchmark import runs_of

    tokenizer = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
    checked = 0
    prepared: set[str] = set()
    built: set[tuple[str, ...]] = set()
    for queue, step, opts in _queued_benchmarks(str(tmp_path)):
        if getattr(opts, "predict", None):
            continue
        if queue not in prepared:  # the rows and folders the queue's lines make before its runs read them
            prepared.add(queue)
            for line in _queue_steps(ROOT / "lab/gpu/queues" / queue):
                _make_what_it_makes(line.replace("$OUT", str(tmp_path)), tokenizer, built)
        runs = runs_of(opts)
        problems, plans = argument_problems(opts, runs)
        assert problems == [], f"{queue}: {step}"
        # Megatron-Bridge's own validation, which each run meets at launch
        for (_, name, _), (_, cfg) in zip(runs, plans, strict=True):
            assert megatron_validation(cfg, gpus_of(name, opts)) is None, f"{queue}: {step}"
        checked += 1
    assert checked >= 20
