# Training: one rule for every run. Single-agent baselines (kind=single, group=model) are trained once per
# model and shared by every pair; joint runs (kind=joint, group=pair) train the pair's agents together.
# A run directory keeps its checkpoints when a job is interrupted; the rerun resumes from them, and a complete
# run of the same spec and inputs is reused.


rule train:
    input:
        train_inputs,
    output:
        "<results>/runs/{kind}/{group}/{method}/seed{seed}/done.json",
    log:
        "<results>/logs/train/{kind}/{group}/{method}/seed{seed}.log",
    benchmark:
        "<results>/benchmarks/train/{kind}/{group}/{method}/seed{seed}.tsv"
    conda:
        PIPE.conda_env
    threads: train_threads  # the run's torch threads: Snakemake's -c counts them
    resources:
        gpu=train_gpus,
    params:
        run=train_spec,  # what the run computes: a change reruns it
        runtime=train_runtime,  # how it runs (threads, memory knobs, placement, logging): never a rerun
        engine=PIPE.cfg.engine,
    shell:
        "hacpo train {params.run:q} --runtime {params.runtime:q} --engine {params.engine} --marker {output}"
        " > {log} 2>&1"


rule train_all:
    input:
        [r.done for r in PIPE.runs],
    localrule: True


# Retention (`retention: {weights: after_eval}`, the default for pretrained models; docs/guide/watching.md,
# "Disk"): once every evaluation the config asks of a run is written, its weights go. The note is this job's
# own output, so the train job's done.json stays and Snakemake never retrains a released run; an evaluation
# asked later stops at once, naming the run (PIPE.eval_inputs). Not temp(): Snakemake deletes a job's
# directory outputs before it runs, and the checkpoints are what an interrupted run resumes from.
rule release_weights:
    input:
        release_inputs,
    output:
        "<results>/runs/{kind}/{group}/{method}/seed{seed}/weights-released.json",
    log:
        "<results>/logs/release/{kind}/{group}/{method}/seed{seed}.log",
    priority: 2  # before a new run's training: a trained run's weights live as briefly as they can
    localrule: True
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        run=subpath(output[0], parent=True),
        evaluations=lambda wildcards, input: input[1:],
    shell:
        "hacpo release-weights {params.run} --evaluations {params.evaluations} > {log} 2>&1"
