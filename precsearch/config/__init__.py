"""Space files: validated models (:mod:`.space`), YAML loading (:mod:`.loader`), whole-file checks (:mod:`.checks`)."""
