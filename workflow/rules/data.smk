# Data: synthetic problems, registry datasets or files of your own → <results>/data/<dataset>.jsonl (+ manifest);
# imported pretrained models (<results>/models/<model>, cached per machine); tiny agents. <results> is the
# config's own folder (results/<config name>; common.smk).


rule prepare_data:
    input:
        dataset_inputs,
    output:
        data="<results>/data/{dataset}.jsonl",
        manifest="<results>/data/{dataset}.manifest.json",
    log:
        "<results>/logs/data/{dataset}.log",
    localrule: True  # downloads happen on the submit host (cluster nodes are often offline)
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        spec=dataset_spec,
    shell:
        "hacpo data --name {wildcards.dataset} --spec {params.spec:q} --out {output.data}"
        " --manifest {output.manifest} > {log} 2>&1"


rule data_manifest:
    input:
        [f.replace(".jsonl", ".manifest.json") for f in PIPE.data_manifest_inputs()],
    output:
        report("<results>/data/manifest.json", category="Data", caption="../report/manifest.rst"),
    log:
        "<results>/logs/data/manifest.log",
    localrule: True
    conda:
        "../../envs/hacpo-cpu.yaml"
    shell:
        "hacpo manifest --out {output} {input} > {log} 2>&1"


rule import_model:
    output:
        "<results>/models/{model}/hacpo-model.json",
    log:
        "<results>/logs/models/{model}.log",
    benchmark:
        "<results>/benchmarks/models/{model}.tsv"
    wildcard_constraints:
        model="|".join(PIPE.imported()) or "^$",
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        spec=import_spec,
        out=subpath(output[0], parent=True),
    shell:
        "hacpo import-model --spec {params.spec:q} --out {params.out} > {log} 2>&1"


# An imported model after a short SFT on the task's train split (`warm: {from: MODEL, …}`): the warm-up
# the real pairs need. Written like an import (its manifest records the base and the recipe).
rule warm_model:
    input:
        base=lambda w: PIPE.import_marker(PIPE.cfg.models[w.model].warm.base),
        train=PIPE.dataset_file(PIPE.cfg.sft.train) if PIPE.cfg.sft else [],
        dev=PIPE.dataset_file(PIPE.cfg.sft.dev) if PIPE.cfg.sft else [],
    output:
        "<results>/models/{model}/hacpo-model.json",
    log:
        "<results>/logs/models/{model}.log",
    benchmark:
        "<results>/benchmarks/models/{model}.tsv"
    wildcard_constraints:
        model="|".join(PIPE.warmed()) or "^$",
    conda:
        "../../envs/hacpo-cpu.yaml"
    threads: 2
    params:
        spec=warm_spec,
        base=lambda w: PIPE.model_path(PIPE.cfg.models[w.model].warm.base),
        out=subpath(output[0], parent=True),
    shell:
        "hacpo warm-model --spec {params.spec:q} --base {params.base} --train {input.train} --dev {input.dev}"
        " --out {params.out} --threads {threads} > {log} 2>&1"


rule build_agent:
    input:
        train=PIPE.dataset_file(PIPE.cfg.sft.train) if PIPE.cfg.sft else [],
        dev=PIPE.dataset_file(PIPE.cfg.sft.dev) if PIPE.cfg.sft else [],
    output:
        "<results>/agents/{model}/agent.json",
    log:
        "<results>/logs/agents/{model}.log",
    benchmark:
        "<results>/benchmarks/agents/{model}.tsv"
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        spec=agent_spec,
        out=subpath(output[0], parent=True),
    shell:
        "hacpo build-agent --spec {params.spec:q} --train {input.train} --dev {input.dev}"
        " --out {params.out} > {log} 2>&1"
