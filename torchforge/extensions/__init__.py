"""PyTorch extensions built from their sdist, for the exact pytorch build of a channel (issue 33).

- sdist: a SPEC (`NAME==VERSION` on a package index, a local archive or folder, `git+URL@REV`) to one local,
  checked source archive;
- metadata: the archive's name, version and requirements (pip, with torch importable), mapped to conda names;
- recipe: one PlannedRecipe (meta.yaml or recipe.yaml) whose host and run pin that pytorch build exactly.
"""
