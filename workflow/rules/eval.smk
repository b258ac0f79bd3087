# Evaluation: one job per checkpoint (base model or a run's final agent) × evaluation setting; it scores every
# benchmark of the setting and writes <bench>.json, <bench>.samples.jsonl (audit) and summary.json (last).


rule evaluate:
    input:
        eval_inputs,
    output:
        "<results>/eval/{setting}/{target}/summary.json",
    log:
        "<results>/logs/eval/{setting}/{target}.log",
    benchmark:
        "<results>/benchmarks/eval/{setting}/{target}.tsv"
    priority: 1  # a trained run's evaluations before the next run's training (retention frees its weights)
    conda:
        PIPE.conda_env
    resources:
        gpu=eval_gpus,
    params:
        source=eval_source,
        settings=eval_settings,  # what the job computes: a change reruns it
        runtime=eval_runtime,  # scorer workers, batch budget, vLLM options: never a rerun
        engine=PIPE.eval_engine,
        out=subpath(output[0], parent=True),
    shell:
        "hacpo eval --source {params.source:q} --settings {params.settings:q} --runtime {params.runtime:q}"
        " --engine {params.engine} --out {params.out} > {log} 2>&1"


# On demand (not part of `all`): score saved responses again, e.g. after a gold-answer fix, without generating:
#   snakemake --configfile config/paper.yaml results/paper/eval/len8k/base/qwen3_4b_base/math500.rescored.json
rule rescore:
    input:
        summary="<results>/eval/{setting}/{target}/summary.json",
        benchmark=rescore_benchmark,
    output:
        "<results>/eval/{setting}/{target}/{bench}.rescored.json",
    log:
        "<results>/logs/eval/{setting}/{target}/{bench}.rescore.log",
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        samples=subpath(output[0], strip_suffix=".rescored.json", with_suffix=".samples.jsonl"),
    shell:
        "hacpo rescore --samples {params.samples} --benchmark {input.benchmark} --out {output} > {log} 2>&1"
