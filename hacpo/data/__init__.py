"""Problems: synthetic arithmetic families (:mod:`.synthetic`), the paper's benchmarks and training sets at
pinned Hub revisions (:mod:`.registry`), users' own datasets (:mod:`.own`), and their preparation into
``id, problem, answer`` JSONL (:mod:`.prepare`)."""
