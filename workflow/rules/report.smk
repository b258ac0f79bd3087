# Tables (CSV + Markdown + LaTeX, paper values beside ours) and seaborn figures, in the paper's numbering.


rule table:
    input:
        table_inputs,
    output:
        csv=report(
            "results/tables/{table}.csv",
            category="Tables",
            labels={"table": "{table}", "format": "csv"},
        ),
        md="results/tables/{table}.md",
        tex="results/tables/{table}.tex",
    log:
        "results/logs/tables/{table}.log",
    localrule: True
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        spec=table_spec,
    shell:
        "hacpo report table --spec {params.spec:q} --out-prefix results/tables/{wildcards.table} > {log} 2>&1"


rule figure:
    input:
        figure_inputs,
    output:
        png=report(
            "results/figures/{figure}.png",
            category="Figures",
            labels={"figure": "{figure}"},
        ),
        csv="results/figures/{figure}.csv",
    log:
        "results/logs/figures/{figure}.log",
    localrule: True
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        spec=figure_spec,
    shell:
        "hacpo report figure --spec {params.spec:q} --out-prefix results/figures/{wildcards.figure} > {log} 2>&1"
