# Training: single-agent baselines (trained once per model, shared by every pair) and joint runs.
# A run directory keeps its checkpoints when a job is interrupted; the rerun resumes from them.


rule train_single:
    input:
        train_inputs,
    output:
        "results/runs/single/{model}/{method}/seed{seed}/done.json",
    log:
        "results/logs/train/single/{model}/{method}/seed{seed}.log",
    benchmark:
        "results/benchmarks/train/single/{model}/{method}/seed{seed}.tsv"
    conda:
        "../../envs/hacpo-cpu.yaml"
    resources:
        gpu=train_gpus,
    params:
        run=train_params,
        engine=PIPE.cfg.engine,
    shell:
        "hacpo train {params.run:q} --engine {params.engine} --marker {output} > {log} 2>&1"


rule train_joint:
    input:
        train_inputs,
    output:
        "results/runs/joint/{pair}/{method}/seed{seed}/done.json",
    log:
        "results/logs/train/joint/{pair}/{method}/seed{seed}.log",
    benchmark:
        "results/benchmarks/train/joint/{pair}/{method}/seed{seed}.tsv"
    conda:
        "../../envs/hacpo-cpu.yaml"
    resources:
        gpu=train_gpus,
    params:
        run=train_params,
        engine=PIPE.cfg.engine,
    shell:
        "hacpo train {params.run:q} --engine {params.engine} --marker {output} > {log} 2>&1"


rule train_all:
    input:
        [r.done for r in PIPE.runs],
    localrule: True
