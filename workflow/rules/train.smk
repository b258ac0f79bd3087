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
