# Config validation, wildcard constraints and the thin input/params functions over hacpo.pipeline.
import functools
import sys

from hacpo.pipeline import Pipeline, Unrecorded, as_json
from hacpo.pipeline.hooks import (
    check_profile_gpus,
    check_results_from,
    check_results_owner,
    put_interpreter_on_path,
    record_results_owner,
    start_worker,
    stop_worker,
)
from hacpo.pipeline.targets import TARGET_PATTERN

# Validates the whole config (key-path errors) before any job runs.
PIPE = Pipeline(config, base_dir=workflow.basedir, config_files=workflow.configfiles)
put_interpreter_on_path()
# Each config writes only under its own folder: results/<config name>, or its `results_dir:`.
check_results_owner(PIPE)
check_results_from(PIPE)  # other machines' folders a scorecard pools
# a GPU profile with a CPU config: refused before anything is submitted
check_profile_gpus(PIPE, workflow.resource_settings.overwrite_resources or {}, sys.argv)


pathvars:
    results=PIPE.results,


wildcard_constraints:
    dataset="|".join(PIPE.cfg.datasets),
    model="|".join(PIPE.cfg.models),
    kind="single|joint",
    group="|".join([*PIPE.cfg.models, *PIPE.cfg.pairs]),
    setting="|".join(PIPE.cfg.eval_settings),
    table="|".join(PIPE.table_names("table")) or "none",
    drawn="|".join(PIPE.table_names("drawn")) or "none",
    claims="|".join(PIPE.table_names("claims")) or "none",
    figure="|".join(PIPE.cfg.figures) or "none",
    method="[a-z][a-z0-9_]*",
    bench="|".join(PIPE.cfg.benchmarks),
    seed=r"\d+",
    target=TARGET_PATTERN,
    k=r"\d+",


def _run(wildcards):
    return PIPE.run_at(wildcards.kind, wildcards.group, wildcards.method, int(wildcards.seed))


def train_inputs(wildcards):
    return PIPE.train_inputs(_run(wildcards))


def train_spec(wildcards):
    return as_json(PIPE.train_spec(_run(wildcards)))


def train_runtime(wildcards):
    return Unrecorded(PIPE.train_runtime(_run(wildcards)))


def train_threads(wildcards):
    return PIPE.train_runtime(_run(wildcards)).get("threads", 1)


def release_inputs(wildcards):
    return PIPE.release_inputs(_run(wildcards))


def train_gpus(wildcards):
    return PIPE.gpus(_run(wildcards))


def table_inputs(wildcards):
    return PIPE.table(wildcards.table)[0]


def table_spec(wildcards):
    return as_json(PIPE.table(wildcards.table)[1])


def drawn_inputs(wildcards):
    return PIPE.table(wildcards.drawn)[0]


def drawn_spec(wildcards):
    return as_json(PIPE.table(wildcards.drawn)[1])


def claims_inputs(wildcards):
    return PIPE.table(wildcards.claims)[0]


def claims_spec(wildcards):
    return as_json(PIPE.table(wildcards.claims)[1])


# A sequential scorecard's look k: the rows still open after look k − 1 get a block of new seeds. Its inputs,
# spec and previous record are one computation, made once a look (a failed checkpoint lookup is not kept).
@functools.lru_cache(maxsize=None)
def _look_of(claims, k):
    previous = None
    if k > 1:
        previous = checkpoints.claims_look.get(claims=claims, k=k - 1).output.record
    sizes = PIPE.look_sizes(claims, previous)
    return PIPE.claims_look(claims, sizes), previous


def _look(wildcards):
    return _look_of(wildcards.claims, int(wildcards.k))


def look_inputs(wildcards):
    return look_inputs_of(wildcards.claims, int(wildcards.k))


def look_inputs_of(claims, k):
    (files, _), previous = _look_of(claims, k)
    return files + ([previous] if previous else [])


def look_spec(wildcards):
    return as_json(_look(wildcards)[0][1])


def look_previous(wildcards):
    previous = _look(wildcards)[1]
    return f"--previous {previous}" if previous else ""


def decided_look(name):
    """The record of the look at which every row of `name` is decided or at its budget."""
    import json

    k = 1
    while True:
        record = checkpoints.claims_look.get(claims=name, k=k).output.record
        if json.load(open(record))["done"]:  # + the release notes of every look's runs (retention)
            runs = PIPE.runs_of([f for j in range(1, k + 1) for f in look_inputs_of(name, j)])
            notes = PIPE.release_targets(runs)
            return PIPE.look_files(name, k) | {f"release{i}": f for i, f in enumerate(notes)}
        k += 1


def copy_named(inputs, outputs, log):
    """Copy each named input to the output of its name (a `run:` block: Snakemake formats no shell command
    whose inputs a checkpoint has yet to decide)."""
    import shutil

    with open(log, "w") as said:
        for key in outputs.keys():
            shutil.copyfile(inputs[key], outputs[key])
            print(inputs[key], "->", outputs[key], file=said)


def figure_inputs(wildcards):
    return PIPE.figure(wildcards.figure)[0]


def figure_spec(wildcards):
    return as_json(PIPE.figure(wildcards.figure)[1])


def eval_inputs(wildcards):
    return PIPE.eval_inputs(wildcards.setting, wildcards.target)


def eval_source(wildcards):
    return as_json(PIPE.eval_source(wildcards.target))


def eval_settings(wildcards):
    return as_json(PIPE.eval_settings(wildcards.setting))


def eval_runtime(wildcards):
    return Unrecorded(PIPE.eval_runtime(wildcards.setting))


def eval_gpus(wildcards):
    return PIPE.eval_gpus(wildcards.target)


def rescore_benchmark(wildcards):
    return PIPE.dataset_file(PIPE.cfg.benchmarks[wildcards.bench].dataset)


def agent_spec(wildcards):
    return as_json(PIPE.agent_params(wildcards.model))


def import_spec(wildcards):
    return as_json(PIPE.import_params(wildcards.model))


def warm_spec(wildcards):
    return as_json(PIPE.warm_params(wildcards.model))


def dataset_spec(wildcards):
    return PIPE.dataset_params(wildcards.dataset)


def dataset_inputs(wildcards):
    return PIPE.dataset_inputs(wildcards.dataset)


# A warm worker pre-imports torch/transformers once for the many short local jobs (hacpo.pipeline.hooks).
onstart:
    PIPE.cfg.logging.check_environment()  # W&B's package and key, before the first job
    PIPE.check_model_sources()  # imported models' packages and the GGUF reader
    PIPE.check_own_datasets()  # `local:` files: present, every record mapped, ids unique
    record_results_owner(PIPE)
    start_worker(workflow.local_exec, log=f"{PIPE.results}/logs/worker.log")


onsuccess:
    stop_worker()


onerror:
    stop_worker()
