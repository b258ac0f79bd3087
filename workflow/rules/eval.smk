# Evaluation: one job per checkpoint (base model or a run's final agent) × evaluation setting; it scores every
# benchmark of the setting and writes <bench>.json, <bench>.samples.jsonl (audit) and summary.json (last).


rule evaluate:
    input:
        eval_inputs,
    output:
        "results/eval/{setting}/{target}/summary.json",
    log:
        "results/logs/eval/{setting}/{target}.log",
    conda:
        "../../envs/hacpo-cpu.yaml"
    resources:
        gpu=eval_gpus,
    params:
        source=eval_source,
        settings=eval_settings,
        engine=PIPE.cfg.engine,
    shell:
        "hacpo evaluate --source {params.source:q} --settings {params.settings:q} --engine {params.engine}"
        " --out results/eval/{wildcards.setting}/{wildcards.target} > {log} 2>&1"
