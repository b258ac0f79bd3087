"""Workflow-facing commands: ``manifest``, ``rescore``, ``profiles``, ``plan``, ``prefetch``,
``pack-results``, ``unpack-results``, and the workflow forms of
``hacpo data --spec`` and ``hacpo eval --source/--settings`` (thin; logic elsewhere)."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path

from hacpo.runio import RunRecord, json_arg, sha256_file


def write_dataset(args) -> int:
    """``hacpo data --spec``: one workflow dataset file, synthetic problems, a registry dataset (local file
    → cache → Hub) or a file of your own (:mod:`hacpo.data.own`), and its manifest entry."""
    from hacpo.runio import atomic_write_json

    spec = json_arg(args.spec, "--spec")
    name = args.name or Path(args.out).name.removesuffix(".gz").removesuffix(".jsonl")
    if "local" in spec or "hub" in spec:
        from hacpo.data import own
        from hacpo.data.synthetic import write_jsonl

        rows, path = own.load_entry(spec, name, f"datasets.{name}", args.cache)
        rows = rows[: spec.get("limit")]
        write_jsonl(args.out, rows)
        kind = "local" if "local" in spec else "hub"
        entry = {"kind": kind, **spec, "count": len(rows), "source_sha256": sha256_file(path)}
    elif "synthetic" in spec:
        from hacpo.data.synthetic import make_splits, write_jsonl

        s = spec["synthetic"]
        rows = make_splits(
            s["families"], seed=s["seed"], n_test=s["n_test"], n_dev=s["n_dev"], n_train=s.get("n_train")
        )
        write_jsonl(args.out, [p.to_dict() for p in rows[s["split"]]])
        entry = {"kind": "synthetic", **s, "count": len(rows[s["split"]])}
    else:
        from hacpo.data.prepare import prepare_dataset

        entry = prepare_dataset(
            spec["registry"],
            args.out,
            local_file=spec.get("file"),
            cache_dir=args.cache,
            allow_download=not args.offline,
            expect_count=spec.get("check_count", True),
            prompt_style="paper",
        )
        entry = {"kind": "registry", **entry}
        if spec.get("limit"):  # the first N records, after the full file's count was checked
            from hacpo.data.synthetic import read_jsonl, write_jsonl

            rows = read_jsonl(args.out)[: spec["limit"]]
            write_jsonl(args.out, rows)
            entry.update(limit=spec["limit"], count=len(rows))
    entry = {"name": name, **entry, "file": args.out, "sha256": sha256_file(args.out)}
    atomic_write_json(args.manifest, entry)
    print(json.dumps(entry))
    return 0


def cmd_manifest(args) -> int:
    from hacpo.data.prepare import write_manifest

    write_manifest([json.loads(Path(p).read_text()) for p in args.inputs], args.out)
    return 0


def evaluate_setting_job(args) -> int:
    """``hacpo eval --source --settings``: every benchmark of one evaluation setting for one checkpoint."""
    from hacpo.eval import evaluate_setting, resolve_source
    from hacpo.specs import EvalJob, EvalRuntime, checked

    source, settings = json_arg(args.source, "--source"), json_arg(args.settings, "--settings")
    # how it runs (Pipeline.eval_runtime: --runtime, or runtime keys in a hand-written --settings), apart
    # from what it computes
    runtime = {k: settings.pop(k) for k in list(settings) if k in EvalRuntime.model_fields}
    if args.runtime:
        runtime |= json_arg(args.runtime, "--runtime")
    settings = {**checked(EvalJob, settings), **checked(EvalRuntime, runtime)}
    for name, b in settings["benchmarks"].items():
        if not Path(b["file"]).is_file():
            raise FileNotFoundError(f"benchmark {name}: {b['file']} does not exist (prepare the data first)")
    path = resolve_source(source)
    with contextlib.ExitStack() as scratch:
        gen = _generator(args, settings, path, scratch)
        workers = settings.get("scorer_workers", 0) if args.scorer_workers is None else args.scorer_workers
        results = evaluate_setting(gen, settings, args.out, seed=args.seed, scorer_workers=workers)
    print(json.dumps({k: v["value"] for k, v in results.items()}))
    return 0


def _generator(args, settings: dict, path: str, scratch: contextlib.ExitStack):
    """The evaluation job's generator for checkpoint ``path``: vLLM serves directories, so an adapter
    checkpoint is merged into a temporary one under the job's output first (removed when ``scratch``
    closes)."""
    if args.engine == "vllm":
        from hacpo.agents.adapters import servable
        from hacpo.eval.vllm import VLLMGenerator, context_length

        path = str(scratch.enter_context(servable(path, args.out)))
        vllm = dict(settings.get("vllm", {}))
        vllm["max_model_len"] = context_length(path, settings, vllm.get("max_model_len"))
        return VLLMGenerator(path, seed=args.seed, **vllm)
    else:
        from hacpo.eval.local import LocalGenerator

        return LocalGenerator(
            path,
            device=args.device,
            threads=args.threads,
            batch_tokens=getattr(args, "batch_tokens", None) or settings.get("batch_tokens"),
            precision=getattr(args, "precision", None) or settings.get("precision", "fp32"),
        )


def cmd_rescore(args) -> int:
    from hacpo.eval.run import rescore, reward_from_spec

    reward = reward_from_spec(args.reward) if args.reward else None
    summary = rescore(
        args.samples, args.benchmark, args.out, scorer_workers=args.scorer_workers, reward=reward
    )
    keys = ("benchmark", "accuracy", "changed", "reward", "verifier_from")
    print(json.dumps({k: summary[k] for k in keys}))
    return 0


def cmd_profiles(args) -> int:
    """One CSV row per training run: wall time, per-phase split and peak memory from the run's profile.json,
    beside Snakemake's benchmark TSV of the job (host wall time and RSS of the whole job)."""
    import csv
    import io

    from hacpo.runio import Profile, atomic_write_text

    rows = []
    for run_dir, bench in zip(args.runs, args.benchmarks, strict=True):
        prof = Profile.read(run_dir)
        cfg = RunRecord.read(run_dir).config
        with open(bench) as f:
            tsv = next(csv.DictReader(f, delimiter="\t"))
        rows.append(
            {
                "run": run_dir,
                "method": cfg["method"],
                "agents": "+".join(a["name"] for a in cfg["agents"]),
                "seed": cfg["seed"],
                "engine": prof.engine,
                "steps": prof.steps,
                "train_s": round(prof.wall_s, 3),
                **{f"{k}_s": round(v, 3) for k, v in prof.phase_s.items()},
                "tokens_per_s": round(prof.tokens_per_s, 1),
                "peak_rss_mb": round(prof.peak_rss_mb, 1),
                "peak_gpu_mem_mb": prof.peak_gpu_mem_mb,
                "job_s": float(tsv["s"]),
                "job_max_rss_mb": tsv["max_rss"],
            }
        )
    fields = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(args.out, buf.getvalue())
    return 0


def cmd_plan(args) -> int:
    """What a config asks for: runs per kind and method, evaluation jobs, tables and figures."""
    from hacpo.pipeline import Pipeline

    pipe = Pipeline.from_files(args.configfile)
    runs = pipe.runs
    by = Counter(f"{r.kind}:{r.method}" for r in runs)
    print(
        f"{len(runs)} training runs ({sum(r.kind == 'single' for r in runs)} single, "
        f"{sum(r.kind == 'joint' for r in runs)} joint)"
    )
    for key, n in sorted(by.items()):
        print(f"  {key:32s} {n}")
    print(f"{len(pipe.cfg.pairs)} pairs")
    for name, pair in pipe.cfg.pairs.items():
        print(f"  {name:32s} {' + '.join(pair.agents)}  ({pair.heterogeneity or 'heterogeneity not stated'})")
    tables, figures = pipe.defaults("tables"), pipe.defaults("figures")
    evals = sorted({f for t in tables for f in pipe.table(t)[0] if "/eval/" in f})
    print(f"{len(evals)} evaluation jobs; {len(tables)} tables; {len(figures)} figures")
    if opt_in := [n for n in [*pipe.cfg.tables, *pipe.cfg.figures] if n not in {*tables, *figures}]:
        print(f"built only when named (default: false): snakemake {' '.join(opt_in)}")
    return 0


def cmd_prefetch(args) -> int:
    """What the config reads from the Hub, fetched into the caches its jobs read (:mod:`.prefetch`)."""
    from hacpo.pipeline import Pipeline
    from hacpo.pipeline.prefetch import prefetch

    for line in prefetch(Pipeline.from_files(args.configfile)):
        print(line)
    return 0


def cmd_pack_results(args) -> int:
    from hacpo.pipeline.packs import pack

    p = pack(args.results, args.out)
    print(f"{args.out}: {p.files} files ({p.bytes / 1e6:.1f} MB before compression), runs of "
          f"{', '.join(p.machine_types) or 'no machine'}; without weights")  # fmt: skip
    for d in p.left_out:
        print(f"  left out, to redo where it is unpacked: {d}")
    return 0


def cmd_release_weights(args) -> int:
    from hacpo.checkpoints import release_weights

    freed = release_weights(args.run, args.evaluations)
    print(f"{args.run}: weights released ({freed / 1e9:.2f} GB) after {len(args.evaluations)} evaluations")
    return 0


def cmd_unpack_results(args) -> int:
    from hacpo.pipeline.packs import drift, unpack

    new = unpack(args.pack, args.results, other_machine=args.other_machine)
    print(f"{args.results}: {len(new)} files unpacked from {args.pack}")
    for line in drift(args.pack):  # a note, not a refusal: pooling across versions is allowed
        print(f"  note: {line}; runs trained here may compute differently from the packed ones")
    return 0


def add_cli(sub) -> None:
    m = sub.add_parser("manifest", help="merge per-dataset manifest entries")
    m.add_argument("--out", required=True, help="the merged manifest (JSON) to write")
    m.add_argument("inputs", nargs="+", help="per-dataset manifest entries (JSON); a name's later entry wins")
    m.set_defaults(func=cmd_manifest)

    r = sub.add_parser("rescore", help="score saved responses again (no generation) against a benchmark file")
    r.add_argument("--samples", required=True, help="<bench>.samples.jsonl written by evaluate")
    r.add_argument("--benchmark", required=True,
                   help="benchmark JSONL with the golds (id, answer) and each record's metadata")  # fmt: skip
    r.add_argument("--out", required=True, help="summary JSON; the re-scored audit goes beside it")
    r.add_argument("--scorer-workers", type=int, default=2,
                   help="math-verify or verifier processes (0: math-verify in this process)")  # fmt: skip
    r.add_argument(
        "--reward", default=None,
        help="score with this verifier instead of the one the audit records (the summary says so): "
             "math_verify, hendrycks, pkg.module:name or path/to/verify.py:name",
    )  # fmt: skip
    r.set_defaults(func=cmd_rescore)

    f = sub.add_parser("profiles", help="collect every run's time and peak memory into one CSV")
    f.add_argument("--out", required=True, help="the CSV to write, one row per run")
    f.add_argument("--runs", nargs="+", required=True, help="run directories")
    f.add_argument("--benchmarks", nargs="+", required=True, help="Snakemake benchmark TSVs, same order")
    f.set_defaults(func=cmd_profiles)

    k = sub.add_parser(
        "pack-results", help="a results folder's finished runs, evaluations and tables, without weights"
    )
    k.add_argument("results", help="the results folder (results/<config name>)")
    k.add_argument("--out", required=True, help="the pack to write (.tar.gz)")
    k.set_defaults(func=cmd_pack_results)

    u = sub.add_parser(
        "unpack-results", help="a pack into a results folder: its jobs count as done there (checked first)"
    )
    u.add_argument("pack", help="a pack written by pack-results")
    u.add_argument("results", help="the results folder; its models built first on this machine")
    u.add_argument(
        "--other-machine", action="store_true",
        help="runs of another CPU type, into a folder of their own, read through a scorecard's results_from:",
    )  # fmt: skip
    u.set_defaults(func=cmd_unpack_results)

    w = sub.add_parser(
        "release-weights",
        help="remove a complete run's weights once its evaluations are written (the workflow's retention)",
    )
    w.add_argument("run", help="the run directory")
    w.add_argument("--evaluations", nargs="*", default=[],
                   help="summary files that must exist first (its evaluations)")  # fmt: skip
    w.set_defaults(func=cmd_release_weights)

    p = sub.add_parser("plan", help="list the runs and jobs a workflow config asks for")
    add_configfile_argument(p)
    p.set_defaults(func=cmd_plan)

    h = sub.add_parser(
        "prefetch",
        help="fetch every model and dataset a workflow config reads from the Hub into the caches its jobs "
        "read (on a node with internet), each pinned revision resolved; with HF_HUB_OFFLINE=1: check them",
    )
    add_configfile_argument(h)
    h.set_defaults(func=cmd_prefetch)


def add_configfile_argument(parser) -> None:
    """``--configfile F …``: the workflow config files of a command that reads a workflow (plan, status)."""
    parser.add_argument(
        "--configfile", nargs="+", default=["config/config.yaml"],
        help="workflow config files, as snakemake reads them (later files' keys win)",
    )  # fmt: skip
