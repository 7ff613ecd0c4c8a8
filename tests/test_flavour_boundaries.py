"""Where a flavour may be imported from (issue 30: one plan for every flavour).

A flavour turns a request into a plan; everything else consumes the plan, never a flavour's own model. Three
rules, read from the imports (tests/test_import_cycles.py collects them):

(a) flavours never import each other;
(b) nothing outside torchforge/flavours/ imports a flavour's internals: a submodule of a flavour package
    (`torchforge.flavours.official.recipe`) or a private name of a flavour; a flavour's face, its package's
    __init__.py, names what the rest may use;
(c) torchforge/commands/ imports no flavour module at all (the registry `torchforge.flavours` alone), so that
    commands parse flags, call the library and print, and never fork on the flavour.

Today's code breaks each rule in places the redesign removes, move by move. Those places are listed below as
ratchets that may only shrink: a new offence fails, and so does a listed one that is gone (take it off the list
in the commit that fixes it). The lists name importer -> what it imports.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

import pytest

from tests.test_import_cycles import ImportEdge, _modules, import_edges

REGISTRY = "torchforge.flavours"
# The registry and the neutral plan types every flavour produces and everything below consumes (not a flavour).
NEUTRAL = (REGISTRY, f"{REGISTRY}.base")
COMMANDS = "torchforge.commands"

# Each flavour is a package under torchforge/flavours/ (official/, conda_forge/): the official model (the request,
# the classification rules, the template context, the companion metapackages, the magma source and the recipe
# files, the --with torchvision and torchaudio recipes) was flat at the top of the package and listed here in a
# tuple until issue 43's move 4 took it into torchforge/flavours/official/; a module belongs to a flavour by its
# place alone (flavour_of).

# ---- ratchets (issue 30): may only shrink ---------------------------------------------------------------------

# (a) one flavour importing another: none (the conda-forge flavour's last borrowings, the source type, the
# template environment and the shared flags, are below both now: sourcestate, templates, sharedflags).
FLAVOURS_IMPORTING_EACH_OTHER: dict[str, frozenset[str]] = {}

# (b) modules outside torchforge/flavours/ (commands/ apart: rule (c) is stricter) that import a flavour"s
# internals (issue 30, moves 4 to 7: consumers take the plan).
# Move 4 emptied it: compilecache's official cache material (context_material, of a RecipeContext) went into the
# official flavour, and pipeline's describe_settings (a package's recorded settings for a message) into pipeline.
INTERNALS_IMPORTED_FROM_OUTSIDE: dict[str, frozenset[str]] = {}

# (c) command modules that import a flavour module (issue 30, moves 5 and 6: commands/flavour.py goes, the
# sequencer moves into the library).
COMMANDS_IMPORTING_FLAVOURS: dict[str, frozenset[str]] = {}


def flavour_of(module: str) -> str | None:
    """The flavour a module belongs to (its package's name under the registry), or None for the registry and
    everything else."""
    if module in NEUTRAL:
        return None
    if module.startswith(REGISTRY + "."):
        return module.split(".")[2]
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _sources() -> dict[str, str]:
    return {name: path.read_text(encoding="utf-8") for name, path in _modules().items()}


def _private_attributes(edges: list[ImportEdge], sources: dict[str, str]) -> Iterable[tuple[str, str]]:
    """(importer, `module:_name`) for every `alias._name` read where `alias` is a flavour module bound by an import."""
    by_importer: dict[str, dict[str, str]] = {}
    for edge in edges:
        if edge.alias is not None and flavour_of(edge.target) is not None:
            by_importer.setdefault(edge.importer, {})[edge.alias] = edge.target
    for importer, bound in by_importer.items():
        for node in ast.walk(ast.parse(sources[importer])):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                    and _private(node.attr):
                yield importer, f"{bound[node.value.id]}:{node.attr}"


def _what(edge: ImportEdge) -> str:
    return f"{edge.target}:{edge.name}" if edge.name is not None and _private(edge.name) else edge.target


def _collect(pairs: Iterable[tuple[str, str]]) -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = {}
    for importer, what in pairs:
        found.setdefault(importer, set()).add(what)
    return {importer: frozenset(whats) for importer, whats in sorted(found.items())}


def flavours_importing_each_other(edges: list[ImportEdge]) -> dict[str, frozenset[str]]:
    def crosses(edge: ImportEdge) -> bool:
        ours, theirs = flavour_of(edge.importer), flavour_of(edge.target)
        return ours is not None and theirs is not None and ours != theirs

    return _collect((e.importer, e.target) for e in edges if crosses(e))


def _internal(edge: ImportEdge) -> bool:
    """A flavour's internals: a submodule of a flavour package (`torchforge.flavours.X.Y`) or a private name of a
    flavour."""
    if flavour_of(edge.target) is None:
        return False
    return edge.target.count(".") > 2 or (edge.name is not None and _private(edge.name))


def _outside(module: str) -> bool:
    return module != REGISTRY and flavour_of(module) is None and not module.startswith(COMMANDS + ".")


def internals_imported_from_outside(edges: list[ImportEdge],
                                    sources: dict[str, str] | None = None) -> dict[str, frozenset[str]]:
    direct = [(e.importer, _what(e)) for e in edges if _outside(e.importer) and _internal(e)]
    attributes = [(i, what) for i, what in _private_attributes(edges, sources or _sources()) if _outside(i)]
    return _collect([*direct, *attributes])


def commands_importing_flavours(edges: list[ImportEdge]) -> dict[str, frozenset[str]]:
    return _collect((e.importer, _what(e)) for e in edges
                    if e.importer.startswith(COMMANDS + ".") and flavour_of(e.target) is not None)


def ratchet_message(rule: str, found: dict[str, frozenset[str]], listed: dict[str, frozenset[str]]) -> str:
    """What differs between today's offences and the list, each line saying what to do."""
    lines = []
    for importer in sorted(found.keys() | listed.keys()):
        new = found.get(importer, frozenset()) - listed.get(importer, frozenset())
        gone = listed.get(importer, frozenset()) - found.get(importer, frozenset())
        lines += [f"  new: {importer} imports {what}: {rule}" for what in sorted(new)]
        lines += [f"  fixed: {importer} no longer imports {what}: take it off the list" for what in sorted(gone)]
    return "\n".join(lines)


RULES = {
    "flavours never import each other (issue 30)":
        (flavours_importing_each_other, FLAVOURS_IMPORTING_EACH_OTHER),
    "only the flavours' own modules import a flavour's internals; use the plan (issue 30)":
        (internals_imported_from_outside, INTERNALS_IMPORTED_FROM_OUTSIDE),
    "torchforge/commands/ imports no flavour module, only the registry torchforge.flavours (issue 30)":
        (commands_importing_flavours, COMMANDS_IMPORTING_FLAVOURS),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_flavour_boundary_offences_only_shrink(rule: str) -> None:
    finder, listed = RULES[rule]
    found = finder(import_edges())
    assert found == listed, f"{rule}:\n{ratchet_message(rule, found, listed)}"


def test_the_rules_see_each_kind_of_offence() -> None:
    # Edges written by hand, so each finder is shown to catch what it is for and to leave the rest alone.
    def edge(importer: str, target: str, name: str | None = None) -> ImportEdge:
        return ImportEdge(importer, target, name, None, 1)

    official = "torchforge.flavours.official"
    assert flavour_of(f"{official}.recipe") == flavour_of(official) == "official"
    assert flavour_of("torchforge.flavours.conda_forge.facts") == "conda_forge"
    assert flavour_of("torchforge.flavours.base") is flavour_of("torchforge.pipeline") is None
    cross = [edge("torchforge.flavours.conda_forge", f"{official}.render", None),
             edge("torchforge.flavours.conda_forge", "torchforge.flavours", None),  # the registry: allowed
             edge(f"{official}.resolve", f"{official}.variant", None)]  # within one flavour: allowed
    assert flavours_importing_each_other(cross) == {"torchforge.flavours.conda_forge": frozenset({f"{official}.render"})}
    outside = [edge("torchforge.pipeline", "torchforge.flavours.conda_forge", "plan_selection"),  # public: allowed
               edge("torchforge.pipeline", "torchforge.flavours.conda_forge", "_facts"),
               edge("torchforge.ci", "torchforge.flavours.conda_forge.facts", None),
               edge("torchforge.sequence", official, "plan_of"),  # the official face: allowed
               edge("torchforge.ci", f"{official}.resolve", "classify"),
               edge("torchforge.commands.build", f"{official}.resolve", "classify")]  # rule (c)'s
    assert internals_imported_from_outside(outside) == {
        "torchforge.ci": frozenset({"torchforge.flavours.conda_forge.facts", f"{official}.resolve"}),
        "torchforge.pipeline": frozenset({"torchforge.flavours.conda_forge:_facts"})}
    commands = [edge("torchforge.commands.build", "torchforge.flavours", "Flavour"),  # the registry: allowed
                edge("torchforge.commands.flavour", "torchforge.flavours.conda_forge", None)]
    assert commands_importing_flavours(commands) == {
        "torchforge.commands.flavour": frozenset({"torchforge.flavours.conda_forge"})}


def test_a_private_attribute_of_a_flavour_module_is_an_internal() -> None:
    # The one offence an import line does not show: `conda_forge._name` read after `from ... import conda_forge`.
    source = "from torchforge.flavours import conda_forge\nconda_forge.load()\nconda_forge._explicit_version('x')\n"
    edges = [ImportEdge("torchforge.standin", "torchforge.flavours.conda_forge", None, "conda_forge", 1)]
    assert internals_imported_from_outside(edges, {"torchforge.standin": source}) == {
        "torchforge.standin": frozenset({"torchforge.flavours.conda_forge:_explicit_version"})}
    # and the import collector binds the names the finder looks for
    assert any(e.alias == "conda_forge" and e.target == "torchforge.flavours.conda_forge" for e in import_edges())


# A flavour plug-in only plans (issue 43, move 3): no hook through which it runs its own sequence beside the plan.
# `render` lost its hook on 2026-12-03 (the official plan marks the companions it renders only with --companions,
# PlannedRecipe.rendered), `build` and `standin-channel` theirs the same day (fourth session): --format wheel is a
# plan of `wheel` recipes naming the pip engine (Plan.engine), the --container cuDNN check reads the plan's
# recipes, the official build's machine checks are its plan's needs (doctor's), and every plan's stand-ins are the
# requirements rattler-build renders of its folders.


def test_no_flavour_runs_its_own_sequence() -> None:
    from torchforge import buildoptions
    from torchforge.flavours import official
    from torchforge.flavours.conda_forge.planning import CondaForgeFlavour

    hooks = {name for cls in (official.OfficialFlavour, CondaForgeFlavour) for name in dir(cls)
             if name.startswith("own_")}
    protocols = {name for value in vars(buildoptions).values() if isinstance(value, type)
                 for name in vars(value) if name.startswith("own_")}
    assert hooks == protocols == set(), (hooks, protocols)
