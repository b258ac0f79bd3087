# Tables (CSV + Markdown + LaTeX, paper values beside ours) and seaborn figures, in the paper's numbering.
# A spec goes to the job through a file beside its log (printf is a shell builtin, so no exec limit applies:
# a five-seed scorecard's spec is larger than the 128 KiB one argument of a command may have).


rule table:
    input:
        table_inputs,
    output:
        csv=report(
            "<results>/tables/{table}.csv",
            category="Tables",
            labels={"table": "{table}", "format": "csv"},
        ),
        md="<results>/tables/{table}.md",
        tex="<results>/tables/{table}.tex",
    log:
        main="<results>/logs/tables/{table}.log",
        spec="<results>/logs/tables/{table}.spec.json",
    localrule: True
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        spec=table_spec,
        prefix=subpath(output.md, strip_suffix=".md"),
    shell:
        "printf %s {params.spec:q} > {log.spec}"
        " && hacpo report table --spec @{log.spec} --out-prefix {params.prefix} > {log.main} 2>&1"


# A table that draws itself (`figure: true`): each method's seeds per agent beside the table.
rule drawn_table:
    input:
        drawn_inputs,
    output:
        csv=report(
            "<results>/tables/{drawn}.csv",
            category="Tables",
            labels={"table": "{drawn}", "format": "csv"},
        ),
        md="<results>/tables/{drawn}.md",
        tex="<results>/tables/{drawn}.tex",
        png=report(
            "<results>/figures/{drawn}.png",
            category="Figures",
            labels={"figure": "{drawn}"},
        ),
    log:
        main="<results>/logs/tables/{drawn}.log",
        spec="<results>/logs/tables/{drawn}.spec.json",
    localrule: True
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        spec=drawn_spec,
        prefix=subpath(output.md, strip_suffix=".md"),
        figure=subpath(output.png, strip_suffix=".png"),
    shell:
        "printf %s {params.spec:q} > {log.spec}"
        " && hacpo report table --spec @{log.spec} --out-prefix {params.prefix}"
        " --figure-prefix {params.figure} > {log.main} 2>&1"


# The scorecard of the paper's claims (paired seeds, intervals, a verdict per claim; docs/statistics.md).
rule scorecard:
    input:
        claims_inputs,
    output:
        csv=report(
            "<results>/tables/{claims}.csv",
            category="Claims",
            labels={"table": "{claims}", "format": "csv"},
        ),
        md="<results>/tables/{claims}.md",
        tex="<results>/tables/{claims}.tex",
        seeds="<results>/tables/{claims}_seeds.csv",
        rst="<results>/tables/{claims}.rst",
        png=report(
            "<results>/figures/{claims}.png",
            category="Claims",
            caption="../report/claims.rst",
            labels={"table": "{claims}", "format": "forest plot"},
        ),
    log:
        main="<results>/logs/tables/{claims}.log",
        spec="<results>/logs/tables/{claims}.spec.json",
    localrule: True
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        spec=claims_spec,
        prefix=subpath(output.md, strip_suffix=".md"),
        figure=subpath(output.png, strip_suffix=".png"),
    shell:
        "printf %s {params.spec:q} > {log.spec}"
        " && hacpo report table --spec @{log.spec} --out-prefix {params.prefix}"
        " --figure-prefix {params.figure} > {log.main} 2>&1"


# A sequential scorecard (tables.<name>.sequential; docs/statistics.md): look k tests every row at its seeds
# and records which stay open; `snakemake decide_<name>` takes looks until every row is decided or at its
# budget, training only the open rows' new seeds (a run a fixed design would have made: the same files).
checkpoint claims_look:
    input:
        look_inputs,
    output:
        **PIPE.look_files("{claims}", "{k}"),
    log:
        main="<results>/logs/tables/{claims}_look{k}.log",
        spec="<results>/logs/tables/{claims}_look{k}.spec.json",
    localrule: True
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        spec=look_spec,
        previous=look_previous,
    shell:
        "printf %s {params.spec:q} > {log.spec}"
        " && hacpo report look --spec @{log.spec} --look {wildcards.k} --out {output.record}"
        " {params.previous} > {log.main} 2>&1"


for _name in PIPE.sequential_tables():

    rule:
        name:
            f"decide_{_name}"
        input:
            unpack(lambda wildcards, name=_name: decided_look(name)),
        output:
            **{
                k: f"{PIPE.results}/tables/{_name}_decided{e}"
                for k, e in (
                    ("record", ".json"),
                    ("md", ".md"),
                    ("csv", ".csv"),
                    ("seeds", "_seeds.csv"),
                )
            },
            png=f"{PIPE.results}/figures/{_name}_decided.png",
        log:
            f"{PIPE.results}/logs/tables/{_name}_decided.log",
        localrule: True
        run:
            copy_named(
                input, output, log[0]
            )  # the last look's card and record, by the table's name


rule figure:
    input:
        figure_inputs,
    output:
        png=report(
            "<results>/figures/{figure}.png",
            category="Figures",
            labels={"figure": "{figure}"},
        ),
        csv="<results>/figures/{figure}.csv",
    log:
        main="<results>/logs/figures/{figure}.log",
        spec="<results>/logs/figures/{figure}.spec.json",
    localrule: True
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        spec=figure_spec,
        prefix=subpath(output.png, strip_suffix=".png"),
    shell:
        "printf %s {params.spec:q} > {log.spec}"
        " && hacpo report figure --spec @{log.spec} --out-prefix {params.prefix}"
        " > {log.main} 2>&1"


# Named partial targets: `snakemake table1`, `snakemake figure2`, … build one table or figure and its runs.
for _name in [*PIPE.cfg.tables, *PIPE.cfg.figures]:

    rule:
        name:
            _name
        input:
            PIPE.named_target(_name),
        localrule: True


rule collect_profiles:
    input:
        done=[r.done for r in PIPE.runs],
        benchmarks=[r.benchmark for r in PIPE.runs],
    output:
        report("<results>/profiles.csv", category="Profiling", caption="../report/profiles.rst"),
    log:
        "<results>/logs/profiles.log",
    localrule: True
    conda:
        "../../envs/hacpo-cpu.yaml"
    params:
        runs=[r.dir for r in PIPE.runs],
    shell:
        "hacpo profiles --out {output} --runs {params.runs} --benchmarks {input.benchmarks} > {log} 2>&1"
