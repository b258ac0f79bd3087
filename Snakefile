# hacpo — regenerate every table and figure of the paper: `snakemake -c2` (toy scale, CPU, minutes);
# the paper itself: `snakemake --configfile config/paper.yaml --workflow-profile profiles/slurm`.
# Stages: data → agents → training → evaluation → tables/figures → `snakemake --report`.
from snakemake.utils import min_version

min_version("9.27")  # path variables: <results>


# Each config file is complete (not an overlay): `--configfile config/paper.yaml` replaces the default.
if not config:

    configfile: f"{workflow.basedir}/config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        PIPE.final_targets(),
