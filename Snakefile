# hacpo reproduction pipeline — the single entry point.
# Today it runs the toy demo (data → agents → GSPO/GSPO×2/Naive/HACPO → table); the full DAG of every
# paper table and figure (issue 4) grows from here through workflow/rules/*.smk.
from snakemake.utils import min_version

min_version("9.0")


rule all:
    input:
        "results/demo/table.md",


rule demo:
    output:
        "results/demo/table.md",
    log:
        "results/logs/demo.log",
    conda:
        "envs/hacpo-cpu.yaml"
    shell:
        "hacpo demo --out results/demo > {log} 2>&1"
