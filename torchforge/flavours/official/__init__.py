"""The official flavour's home: the pytorch channel's package shape (up to 2.5 the only shape there is;
torchforge's hybrid for 2.6+): pytorch per variant, magma-cudaXYZ once per CUDA, the companion metapackages
(pytorch-mutex, cpuonly, pytorch-cuda) and, with --with, torchvision and torchaudio.

variant.py holds the request (the selection and its string forms), resolve.py and resolved.py classify it
(official, buildable or refused) and resolve each variant, magmaplan.py, magmasource.py and bundled.py plan the
magma package, its source and the files a pytorch package bundles, recipe.py makes the template context and
render.py the recipe folders, companions.py the metapackages, stack.py the --with recipes, preflight.py what the
variants need of the machine, wheel.py the --format wheel plan, and planning.py is the plug-in (a Request in,
the neutral Plan out). This module names what the rest of torchforge may use.
"""

from __future__ import annotations

from torchforge.flavours.official.planning import (
    FLAVOUR, OfficialFlavour, matrix_rows, official_steps, plan_of, pytorch_build, selection_of)

__all__ = ["FLAVOUR", "OfficialFlavour", "matrix_rows", "official_steps", "plan_of", "pytorch_build", "selection_of"]
