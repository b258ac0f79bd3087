"""``hacpo <command>``: the single entry point for users and workflow rules.

Commands: ``methods``, ``data``, ``build-agent``, ``train``, ``eval``, ``demo`` (and, from the modules that
own them, ``prepare-data``, ``manifest``, ``rescore``, ``profiles``, ``plan``, ``prefetch``, ``report``,
``worker``): one
command per job, used alike by people and by the workflow's rules. Bad input fails fast with a
message naming the problem, before any model is built.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import sys
from pathlib import Path

import yaml


def _parse_sets(pairs: list[str]) -> dict:
    out = {}
    for item in pairs or []:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key] = yaml.safe_load(value)
    return out


def cmd_methods(args) -> int:
    from hacpo.algo import HACPO_KNOBS, METHODS, SGT_KNOBS, VARIANT_KNOBS

    for m in METHODS.values():
        print(f"{m.name:20s} {json.dumps({k: v for k, v in m.to_dict().items() if k != 'name'})}")
    print(f"\nHACPO hyper-parameters (run config keys, HACPO losses only): {', '.join(HACPO_KNOBS)}")
    print(f"SGT hyper-parameters (run config keys, sharing: successes only): {', '.join(SGT_KNOBS)}")
    print("variant knobs (run config keys):")
    for knob, spec in VARIANT_KNOBS.items():
        print(f"  {knob}: {' | '.join(spec['values'])}  ({', '.join(spec['methods'])} only)")
    return 0


def cmd_data(args) -> int:
    """Synthetic train/dev/test splits (``--families``), or one workflow dataset file (``--spec``)."""
    if args.spec is not None:
        if args.families is not None:
            raise ValueError("give --families (synthetic splits) or --spec (one workflow dataset), not both")
        if not args.manifest:
            raise ValueError("--spec writes one dataset file and its manifest entry: give --manifest too")
        from hacpo.pipeline.cli import write_dataset

        return write_dataset(args)
    from hacpo.data.synthetic import make_splits, write_jsonl

    args.families = args.families or ["add2"]
    splits = make_splits(
        args.families, seed=args.seed, n_test=args.n_test, n_dev=args.n_dev, n_train=args.n_train
    )
    out = Path(args.out)
    for name, problems in splits.items():
        write_jsonl(out / f"{name}.jsonl", [p.to_dict() for p in problems])
        print(f"{name}: {len(problems)} problems → {out / f'{name}.jsonl'}")
    return 0


def cmd_build_agent(args) -> int:
    from hacpo.agents.warmup import build_agent_from_args

    info = build_agent_from_args(args)
    print(json.dumps({k: info[k] for k in ("path", "dev_acc", "steps", "params") if k in info}, indent=2))
    return 0


def cmd_warm_model(args) -> int:
    """An imported model warmed by a short SFT on the task's train split (cached on base, spec and data)."""
    from hacpo.agents.warmup import ModelWarmup, warm_model
    from hacpo.data.synthetic import read_jsonl
    from hacpo.runio import json_arg

    spec = ModelWarmup(**json_arg(args.spec, "--spec"))
    splits = {}
    for name, f in (("train", args.train), ("dev", args.dev)):
        if not Path(f).is_file():
            raise FileNotFoundError(f"--{name}: {f!r} does not exist (write it with `hacpo data`)")
        splits[name] = read_jsonl(f, as_problems=True)
    import torch

    torch.set_num_threads(args.threads)
    info = warm_model(spec, args.base, args.out, splits)
    w = info["warmup"]
    keys = ("dev_acc_start", "dev_acc", "steps", "wall_s")
    print(json.dumps({"path": args.out, "cached": info["cached"], **{k: w[k] for k in keys}}, indent=2))
    return 0


def cmd_import_model(args) -> int:
    """A model source (GGUF file or package, HF directory, pinned Hub repo) → an HF directory (cached)."""
    from hacpo.agents.sources import import_model
    from hacpo.runio import json_arg

    if (args.spec is None) == (args.source is None):
        raise ValueError("give --source (with --prompt-format) or --spec (the import rule's), not both")
    if args.spec is not None:
        spec = json_arg(args.spec)
        manifest = import_model(spec["source"], spec["prompt_format"], args.out)
    else:
        manifest = import_model(json_arg(args.source, "--source"), args.prompt_format, args.out)
    keep = ("architecture", "parameters", "vocab_size", "prompt_format", "stop_tokens", "cache_hit",
            "seconds")  # fmt: skip
    print(json.dumps({"path": args.out, **{k: manifest[k] for k in keep}}, indent=2))
    return 0


def _runtime_options(text: str | None) -> dict:
    """``hacpo train --runtime JSON``: runtime options only (the workflow passes them apart from the spec)."""
    from hacpo.config import RUNTIME_OPTIONS
    from hacpo.runio import json_arg

    if not text:
        return {}
    opts = json_arg(text, "--runtime")
    if unknown := sorted(set(opts) - set(RUNTIME_OPTIONS)):
        raise ValueError(
            f"--runtime takes runtime options only ({', '.join(RUNTIME_OPTIONS)}); {', '.join(unknown)} "
            "change what the run computes: put them in the run config"
        )
    return opts


def cmd_train(args) -> int:
    from hacpo.config import load_train_config

    sets = _parse_sets(args.set)
    unset = [k for k, v in sets.items() if v is None]  # --set key=null: the key's default
    sets = {k: v for k, v in sets.items() if v is not None}
    cfg = load_train_config(args.config, unset=unset, **_runtime_options(args.runtime), **sets)
    if args.progress:
        cfg = cfg.model_copy(update={"progress": True})
    if args.engine == "openrlhf":
        from hacpo.engine_options import OpenRLHFOptions
        from hacpo.engines.openrlhf import refuse_local_only, train

        opts = cfg.openrlhf or OpenRLHFOptions()
        refuse_local_only(cfg)  # before --print-command too
        if opts.gpus_per_node is None:
            raise ValueError("the OpenRLHF engine needs `openrlhf: {gpus_per_node: N}` in the run config")
        if args.print_command:  # what the job would run, as shell lines (nothing is written)
            import shlex

            from hacpo.engines.openrlhf.command import Layout, build_command, joint_agent_args

            layout = Layout(Path(cfg.out_dir))
            if not cfg.resolved_method().joint:
                print(shlex.join(build_command(cfg, opts, layout)))
                return 0
            from hacpo.engines.openrlhf.runner import joint_command

            print(shlex.join(joint_command(cfg, opts, layout)))
            for k, agent in enumerate(cfg.agents):  # each agent's OpenRLHF arguments (in joint.json)
                print(f"# {agent.name}: " + shlex.join(joint_agent_args(cfg, opts, layout, k)))
            return 0
        engine_train = functools.partial(train, opts=opts)
    else:
        from hacpo.engines.local import train as engine_train
    from hacpo.lifecycle import reuse_or_supersede
    from hacpo.runio import atomic_write_json

    reused = args.marker and reuse_or_supersede(cfg)
    run = engine_train(cfg)  # a complete run returns at once
    summary = {
        "status": run.status,
        "step": run.step,
        "out_dir": cfg.out_dir,
        "config_hash": cfg.config_hash(),
        **({"reused": True} if reused else {}),
    }
    if args.marker:
        atomic_write_json(args.marker, summary)
    print(json.dumps(summary))
    return 0


def cmd_eval(args) -> int:
    """A checkpoint on benchmark files (``--checkpoint``/``--benchmark``), or one workflow evaluation job:
    every benchmark of an evaluation setting (``--source``/``--settings``)."""
    workflow = args.source is not None or args.settings is not None
    if workflow:
        if args.checkpoint or args.benchmark:
            raise ValueError("give --checkpoint/--benchmark or --source/--settings, not both")
        if args.source is None or args.settings is None:
            raise ValueError("an evaluation setting needs both --source and --settings")
        from hacpo.pipeline.cli import evaluate_setting_job

        return evaluate_setting_job(args)
    if not args.checkpoint or not args.benchmark:
        raise ValueError("give --checkpoint and --benchmark (or --source and --settings)")
    from hacpo.eval import Sampling, evaluate

    sampling = Sampling(
        greedy=not args.sample,
        k=args.k,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        prompt_style=args.style,
        seed=args.seed,
    )
    for b in args.benchmark:
        if not Path(b).is_file():
            raise ValueError(f"benchmark file {b!r} does not exist")
    from hacpo.agents import adapters

    if not (Path(args.checkpoint) / "config.json").is_file() and not adapters.is_adapter(args.checkpoint):
        raise ValueError(
            f"{args.checkpoint!r} is neither a Hugging Face checkpoint directory (no config.json) nor a LoRA "
            "adapter checkpoint (no adapter_config.json)"
        )
    if adapters.is_adapter(args.checkpoint):
        adapters.base_of(args.checkpoint, args.base)  # a missing base named before any model loads
    with contextlib.ExitStack() as scratch:
        if args.engine == "vllm":
            from hacpo.eval.vllm import VLLMGenerator

            served = scratch.enter_context(adapters.servable(args.checkpoint, args.out, args.base))
            gen = VLLMGenerator(str(served), seed=args.seed)
        else:
            from hacpo.eval.local import LocalGenerator

            gen = LocalGenerator(
                args.checkpoint,
                device=args.device,
                threads=args.threads,
                batch_tokens=args.batch_tokens,
                precision=args.precision or "fp32",
                base=args.base,
            )
        for b in args.benchmark:
            prefix = Path(args.out) / Path(b).stem
            workers = args.scorer_workers or 0
            summary = evaluate(gen, b, prefix, sampling, limit=args.limit, scorer_workers=workers)
            print(json.dumps({k: v for k, v in summary.items() if k != "sampling"}))
    return 0


def cmd_export(args) -> int:
    """A checkpoint as a plain Hugging Face directory (``--merge``: an adapter merged into its base)."""
    from hacpo.agents import adapters

    if not adapters.is_adapter(args.checkpoint):
        if not (Path(args.checkpoint) / "config.json").is_file():
            raise ValueError(f"{args.checkpoint!r} is not a checkpoint directory (no config.json)")
        raise ValueError(
            f"{args.checkpoint!r} is already a plain Hugging Face directory (full fine-tuning): copy it as "
            "it is"
        )
    if not args.merge:
        raise ValueError("an adapter checkpoint exports merged into its base: add --merge")
    if Path(args.out).exists():
        raise ValueError(f"{args.out} exists: choose a new --out (nothing is overwritten)")
    out = adapters.export_merged(args.checkpoint, args.out, args.base)
    print(json.dumps({"exported": str(out), "from": args.checkpoint}))
    return 0


def cmd_demo(args) -> int:
    from hacpo.demo import run_demo

    run_demo(Path(args.out), seeds=args.seeds, steps=args.steps)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hacpo", description=__doc__.splitlines()[0])
    from hacpo import __version__

    p.add_argument("--version", action="version", version=f"hacpo {__version__}")
    p.add_argument(
        "--debug", action="store_true",
        help="an error stops with its traceback, not one line (HACPO_DEBUG=1 does the same)",
    )  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("methods", help="list the method registry").set_defaults(func=cmd_methods)

    d = sub.add_parser(
        "data", help="synthetic train/dev/test splits (--families), or one workflow dataset file (--spec)"
    )
    d.add_argument("--out", required=True, help="splits: a directory; --spec: the dataset's JSONL file")
    d.add_argument("--families", nargs="+", default=None, help="synthetic families (default: add2)")
    d.add_argument("--seed", type=int, default=0, help="the synthetic splits' seed: same seed, same problems")
    d.add_argument("--n-test", type=int, default=1000, help="test problems per family")
    d.add_argument("--n-dev", type=int, default=200, help="dev problems per family")
    d.add_argument(
        "--n-train", type=int, default=None,
        help="training problems per family (default: the rest of add2; 20,000 of a sampled family)",
    )  # fmt: skip
    w = d.add_argument_group("one workflow dataset (the prepare_data rule)")
    w.add_argument("--spec", help="JSON (or @file): {synthetic: {...}} or {registry: NAME, file: …}")
    w.add_argument("--name", help="the dataset's name in the manifest (default: the --out file's stem)")
    w.add_argument("--manifest", help="where to write this dataset's manifest entry")
    w.add_argument("--cache", default=None, help="directory of downloaded dataset files")
    w.add_argument("--offline", action="store_true", help="never download from the Hub")
    d.set_defaults(func=cmd_data)

    b = sub.add_parser("build-agent", help="build a tiny local agent and warm it up by SFT (cached)")
    b.add_argument(
        "--spec", required=True, help="warm-up spec: FILE, FILE:NAME (see config/agents) or inline JSON"
    )
    b.add_argument("--data", help="directory with train.jsonl and dev.jsonl")
    b.add_argument("--train", help="SFT problems (JSONL); with --dev, instead of --data")
    b.add_argument("--dev", help="dev problems (JSONL) for the stopping rule")
    b.add_argument(
        "--out", required=True, help="the agent's directory (an agent of the same spec and data is reused)"
    )
    b.add_argument("--threads", type=int, default=1, help="torch threads")
    b.add_argument("--device", default="cpu", help="cpu (default; bitwise reproducible) or cuda")
    b.set_defaults(func=cmd_build_agent)

    i = sub.add_parser(
        "import-model", help="import a pretrained model (GGUF, package, HF dir, Hub) into an HF directory"
    )
    i.add_argument("--spec", help='the workflow\'s: JSON (or @file) {"source": …, "prompt_format": …}')
    i.add_argument(
        "--source",
        help='JSON (or @file): {"gguf": PATH}, {"package": NAME, "file": FILE}, {"package": NAME}, '
        '{"hf_dir": PATH} or {"hub": ID, "revision": SHA}',
    )  # fmt: skip
    i.add_argument(
        "--prompt-format", default=None,
        help="chat (the model's own template; default) | gemma_turn | completion | few_shot | a YAML file of "
        "a format's fields (instruction, examples, final_answer, turn, stops)",
    )  # fmt: skip
    i.add_argument("--out", required=True, help="the model directory to write")
    i.set_defaults(func=cmd_import_model)

    wm = sub.add_parser("warm-model", help="warm an imported model by a short SFT (cached)")
    wm.add_argument("--spec", required=True, help="JSON (or @file): hacpo.agents.warmup.ModelWarmup's fields")
    wm.add_argument("--base", required=True, help="the imported model's directory (hacpo import-model)")
    wm.add_argument("--train", required=True, help="SFT problems (JSONL)")
    wm.add_argument("--dev", required=True, help="dev problems (JSONL): greedy accuracy along the way")
    wm.add_argument("--out", required=True, help="the warmed model's directory")
    wm.add_argument("--threads", type=int, default=2, help="torch threads")
    wm.set_defaults(func=cmd_warm_model)

    t = sub.add_parser("train", help="train one run (resumes from its last checkpoint)")
    t.add_argument("config", help="YAML/JSON run config file, or inline JSON (see hacpo.config.TrainConfig)")
    t.add_argument(
        "--engine", default="local", choices=["local", "openrlhf"],
        help="local (in this process, on the run config's `device`) or openrlhf (Ray, vLLM, DeepSpeed; "
        "needs `openrlhf: {gpus_per_node: N}` in the run config)",
    )  # fmt: skip
    t.add_argument(
        "--marker",
        help="workflow mode: write this file when done; a complete run of the same spec and inputs is "
        "reused, a stale run dir moved aside",
    )
    t.add_argument(
        "--runtime",
        help="JSON: runtime options (threads, memory knobs, placement, logging), kept apart "
        "from the run's identity",
    )
    t.add_argument(
        "--set", action="append", metavar="KEY=VALUE",
        help="override a config key (VALUE read as YAML; null: the key's default)",
    )  # fmt: skip
    t.add_argument("--progress", action="store_true", help="a progress bar (the run config's `progress`)")
    t.add_argument(
        "--print-command", action="store_true", help="--engine openrlhf: print its command line only"
    )
    t.set_defaults(func=cmd_train)

    e = sub.add_parser(
        "eval",
        help="evaluate a checkpoint on benchmark files, or one workflow job (--source/--settings)",
    )
    e.add_argument("--checkpoint", help="a Hugging Face checkpoint directory")
    e.add_argument("--benchmark", nargs="+", help="benchmark JSONL files")
    e.add_argument("--out", required=True, help="output directory (with --settings, summary.json last)")
    w = e.add_argument_group("one workflow evaluation job (the evaluate rule)")
    w.add_argument("--source", help='JSON: {"model": PATH} or {"run": DIR, "agent": NAME}')
    w.add_argument("--settings", help="JSON (or @file) from Pipeline.eval_settings")
    w.add_argument("--runtime", help="JSON (or @file) from Pipeline.eval_runtime: workers, batch, vLLM")
    e.add_argument(
        "--engine", default="local", choices=["local", "vllm"], help="generation backend (vllm: GPUs)"
    )
    e.add_argument("--sample", action="store_true", help="sample k responses instead of greedy decoding")
    e.add_argument("--k", type=int, default=1, help="with --sample: responses per problem")
    e.add_argument("--temperature", type=float, default=1.0, help="with --sample: the sampling temperature")
    e.add_argument("--top-p", type=float, default=1.0, help="with --sample: nucleus sampling's p")
    e.add_argument("--max-new-tokens", type=int, default=13, help="the longest response generated (tokens)")
    e.add_argument(
        "--style", choices=["compact", "paper"], default="compact",
        help="the prompt: compact, or the paper's instruction",
    )  # fmt: skip
    e.add_argument("--limit", type=int, default=None, help="only the first LIMIT problems of each benchmark")
    e.add_argument("--seed", type=int, default=0, help="the generation's seed")
    e.add_argument(
        "--device", default="auto", help="local engine: auto (CUDA if torch sees one, else CPU), cpu or cuda"
    )
    e.add_argument("--threads", type=int, default=1, help="local engine: torch threads")
    e.add_argument(
        "--batch-tokens", type=int, default=None,
        help="local engine: prompt + new tokens generated at once (the KV cache); default 256 problems",
    )  # fmt: skip
    e.add_argument(
        "--precision", choices=["fp32", "bf16", "auto"], default=None,
        help="local engine: model weights and KV cache (default fp32, or the setting's; bf16 halves both; "
        "auto: bf16 where the CPU or GPU computes it natively)",
    )  # fmt: skip
    e.add_argument("--scorer-workers", type=int, help="math-verify processes (default 0, or the setting's)")
    e.add_argument("--base", help="a LoRA checkpoint's base model, where it is not at the recorded path")
    e.set_defaults(func=cmd_eval)

    x = sub.add_parser("export", help="a LoRA checkpoint merged into its base: a plain HF model directory")
    x.add_argument("--checkpoint", required=True, help="an adapter checkpoint (checkpoints/<agent>/step-N)")
    x.add_argument("--out", required=True, help="the new model directory (must not exist)")
    x.add_argument("--merge", action="store_true", help="merge the adapter into the base's weights")
    x.add_argument("--base", help="the base model, where it is not at the path the adapter records")
    x.set_defaults(func=cmd_export)

    m = sub.add_parser("demo", help="toy end-to-end demo on CPU: data → agents → GSPO vs HACPO → table")
    m.add_argument("--out", default="results/demo", help="where the data, agents, runs and table.md go")
    m.add_argument(
        "--seeds", type=int, nargs="+", default=[0], help="one run per method and seed, averaged in the table"
    )
    m.add_argument("--steps", type=int, default=30, help="training steps per run")
    m.set_defaults(func=cmd_demo)
    for module in (
        "hacpo.pipeline.cli",
        "hacpo.pipeline.status",
        "hacpo.data.prepare",
        "hacpo.report.cli",
        "hacpo.worker",
        "hacpo.engines.openrlhf.ray_cluster",
    ):
        importlib.import_module(module).add_cli(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from hacpo import worker

    argv = sys.argv[1:] if argv is None else list(argv)
    delegated = worker.delegate(argv)  # a warm worker (if the workflow started one) skips the torch import
    if delegated is not None:
        return delegated
    from hacpo.runio import RunStopped

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, RunStopped) as err:
        if args.debug or os.environ.get("HACPO_DEBUG") == "1":
            raise
        where = f"(the traceback: hacpo --debug {args.command} …, or HACPO_DEBUG=1)"
        print(f"hacpo {args.command}: error: {err} {where}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `hacpo methods | head`: the reader is gone, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
