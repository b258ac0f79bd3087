"""Problems and prompts: synthetic arithmetic families (:mod:`hacpo.data.synthetic`)."""
