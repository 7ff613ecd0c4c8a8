"""The conda-forge flavour's home: conda-forge's package shape of PyTorch 2.6+ (libtorch once per CUDA x arch
list, pytorch per Python, the pytorch-gpu / pytorch-cpu metapackage), for any CUDA and arch list.

The feedstock's facts are data (data/conda_forge.toml, each with its commit and file:line); this module checks
them, plans one recipe per (release, platform, CUDA or cpu, arch list) and lays the recipe out with the
templates in recipe_templates/conda_forge/. Pure: no files, no commands.

facts.py holds the feedstock's tables, recipe.py plans and lays out the recipes, planning.py is the plug-in
(a Request in, the neutral Plan out). This module names what the rest of torchforge may use.
"""

from __future__ import annotations

from torchforge.flavours.conda_forge.facts import (
    Accel,
    Blas,
    OUTPUT_KEYS,
    OutputKey,
    PLATFORMS,
    WINDOWS,
    Cited,
    CitedList,
    PythonVariants,
    Pin,
    CiSupport,
    JobFact,
    Row,
    EnvRow,
    PatchFile,
    RecipeFacts,
    Activation,
    Patches,
    PlatformJobs,
    FeedstockRelease,
    FlavourSettings,
    CompilerFlags,
    DroppedLines,
    SourceEdits,
    CMakeHandover,
    ConsumerTestLine,
    ConsumerTest,
    CondaForgeTable,
    CUDA_OFFSET,
    MKL_OFFSET,
    load,
    check_invariants,
)
from torchforge.flavours.conda_forge.recipe import (
    Output, PlannedOutput, CondaForgeRecipe, plan, with_inputs, with_build_strings, windows_build_note,
    platform_jobs, reference_cuda, settings_digest, header, PATCH_FOLDER, CONSUMER_PROJECT, rattler_build_string,
    libtorch_checks, windows_libtorch_checks, recipe_files, plan_selection)
from torchforge.flavours.conda_forge.specs import conda_build_spec, rattler_build_spec, _explicit_version

__all__ = [
    "Accel",
    "Activation",
    "Blas",
    "CMakeHandover",
    "CONSUMER_PROJECT",
    "CUDA_OFFSET",
    "CiSupport",
    "Cited",
    "CitedList",
    "CompilerFlags",
    "CondaForgeRecipe",
    "CondaForgeTable",
    "ConsumerTest",
    "ConsumerTestLine",
    "DroppedLines",
    "EnvRow",
    "FeedstockRelease",
    "FlavourSettings",
    "JobFact",
    "MKL_OFFSET",
    "OUTPUT_KEYS",
    "Output",
    "OutputKey",
    "PATCH_FOLDER",
    "PLATFORMS",
    "PatchFile",
    "Patches",
    "Pin",
    "PlannedOutput",
    "PlatformJobs",
    "PythonVariants",
    "RecipeFacts",
    "Row",
    "SourceEdits",
    "WINDOWS",
    "_explicit_version",
    "check_invariants",
    "conda_build_spec",
    "header",
    "libtorch_checks",
    "load",
    "plan",
    "plan_selection",
    "platform_jobs",
    "rattler_build_spec",
    "rattler_build_string",
    "recipe_files",
    "reference_cuda",
    "settings_digest",
    "windows_build_note",
    "windows_libtorch_checks",
    "with_build_strings",
    "with_inputs",
]
