"""The oracle that is not our own table: conda-forge/pytorch-cpu-feedstock's own recipe (tests/data/feedstock, at
each release's commit) rendered by the real conda-build for one of its linux jobs, next to torchforge's recipe for
the same job rendered by the same conda-build (tests/feedstock_render.py runs in .venv-conda), compared field by
field for every output. Differences torchforge means to have are listed once in tests/data/feedstock_differences.toml.

    python -m tests.feedstock_oracle [VERSION ...]    # the figures per release and platform, and every difference
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from torchforge.flavours import conda_forge
from torchforge.sourcestate import Source
from torchforge.templates import RecipeFormat

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "data" / "feedstock"
DIFFERENCES = ROOT / "tests" / "data" / "feedstock_differences.toml"
RENDER = ROOT / "tests" / "feedstock_render.py"
PYTHON = "3.12"  # every release's jobs build it
ARCH = {"linux-64": "64", "linux-aarch64": "aarch64"}
ORDERED = ("test.commands",)  # lists whose order matters; the others compare as sets


@dataclass(frozen=True)
class Job:
    version: str
    platform: str
    accel: str  # "cpu" or the CUDA X.Y of one of the feedstock's jobs

    @property
    def id(self) -> str:
        return f"{self.version}-{self.platform}-{self.accel}"


@dataclass(frozen=True)
class Finding:
    job: Job
    output: str
    field: str
    status: str  # identical | intended | open (listed, not yet done) | different
    detail: str = ""


def jobs(versions: list[str] | None = None) -> list[Job]:
    """Each release's cpu job and its newest CUDA job, on linux-64 and linux-aarch64."""
    table = conda_forge.load()
    found = []
    for version, release in table.releases.items():
        if versions and version not in versions:
            continue
        for platform in ARCH:
            cudas = release.platforms[platform].cuda
            found += [Job(version, platform, "cpu"), Job(version, platform, max(cudas, key=_numeric))]
    return found


def _numeric(cuda: str) -> tuple[int, ...]:
    return tuple(int(part) for part in cuda.split("."))


def render(recipe: Path, platform: str, variant_file: Path | None) -> dict:
    conda_python = ROOT / ".venv-conda" / "bin" / "python"
    command = [str(conda_python), str(RENDER), str(recipe), ARCH[platform], PYTHON]
    done = subprocess.run([*command, *([str(variant_file)] if variant_file else [])], capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"conda-build could not render {recipe}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def render_pair(job: Job, scratch: Path) -> tuple[dict, dict]:
    """(the feedstock's outputs, torchforge's) for one job."""
    folder = write_torchforge_recipe(job, scratch, RecipeFormat.CONDA_BUILD)
    return render_feedstock(job), render(folder, job.platform, None)


def write_torchforge_recipe(job: Job, scratch: Path, recipe_format: RecipeFormat) -> Path:
    """torchforge's recipe folder for the job (for PYTHON) in `recipe_format`, under `scratch`."""
    recipe = conda_forge.plan(job.version, job.platform, job.accel, None, (PYTHON,))
    files = conda_forge.recipe_files(recipe, Source("git", "https://github.com/pytorch/pytorch", f"v{job.version}"),
                                     recipe_format=recipe_format)
    folder = scratch / f"{job.id}-{recipe_format.value}"
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def render_feedstock(job: Job) -> dict:
    """The feedstock's outputs for one job: its recipe at the release's commit with its .ci_support file."""
    release = conda_forge.load().releases[job.version]
    snapshot = SNAPSHOTS / release.commit
    return render(snapshot / "recipe", job.platform, snapshot / release.platforms[job.platform].ci_support[job.accel].file)


def render_all(selected: list[Job], workers: int = 2) -> dict[Job, tuple[dict, dict]]:
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(workers) as pool:
        pairs = pool.map(lambda job: render_pair(job, Path(scratch)), selected)
        return dict(zip(selected, pairs))


# ---- the comparison ----------------------------------------------------------------------------------------

def load_differences(engine: str = "conda-build") -> dict:
    """The listed differences for torchforge's recipe of `engine` (meta.yaml: conda-build; recipe.yaml:
    rattler-build): a rule with `engine` holds for that engine's recipe only."""
    listed = tomllib.loads(DIFFERENCES.read_text(encoding="utf-8"))
    return {kind: [rule for rule in rules if rule.get("engine", engine) == engine] for kind, rules in listed.items()}


def _applies(rule: dict, job: Job, output: str, field: str) -> bool:
    return (rule.get("output", output) == output and rule.get("field", field) == field
            and (not rule.get("releases") or job.version in rule["releases"])
            and rule.get("accel", _accel_kind(job)) == _accel_kind(job))


def _accel_kind(job: Job) -> str:
    return "cpu" if job.accel == "cpu" else "cuda"


def _rewrite(value: object, side: str, rules: list[dict], job: Job, output: str, field: str) -> object:
    if isinstance(value, list):
        return [_rewrite(item, side, rules, job, output, field) for item in value]
    text = str(value)
    for rule in rules:
        if rule["side"] in (side, "both") and _applies(rule, job, output, field):
            text = re.sub(rule["pattern"], rule["replace"], text)
    return text


def _listing(item: str, side: str, rules: list[dict], job: Job, output: str, field: str) -> dict | None:
    """The `item` rule that lists an item only one side has, if any."""
    return next((rule for rule in rules if rule["side"] == side and _applies(rule, job, output, field)
                 and re.fullmatch(rule["pattern"], item)), None)


def compare_field(job: Job, output: str, field: str, ours_raw: object, theirs_raw: object,
                  differences: dict) -> Finding:
    if ours_raw == theirs_raw or (isinstance(ours_raw, list) and isinstance(theirs_raw, list)
                                  and field not in ORDERED and sorted(map(str, ours_raw)) == sorted(map(str, theirs_raw))):
        return Finding(job, output, field, "identical")
    rewrites = differences.get("rewrite", [])
    theirs = _rewrite(theirs_raw if theirs_raw is not None else [], "feedstock", rewrites, job, output, field)
    ours = _rewrite(ours_raw if ours_raw is not None else [], "torchforge", rewrites, job, output, field)
    if not isinstance(theirs, list) or not isinstance(ours, list):
        if theirs == ours:
            return Finding(job, output, field, "intended")
        return Finding(job, output, field, "different", f"feedstock {theirs_raw!r}, torchforge {ours_raw!r}")
    items = differences.get("item", [])
    listed = {(i, side): _listing(i, side, items, job, output, field)
              for side, only in (("feedstock", [i for i in theirs if i not in ours]),
                                 ("torchforge", [i for i in ours if i not in theirs])) for i in only}
    missing = [i for (i, side), rule in listed.items() if side == "feedstock" and rule is None]
    extra = [i for (i, side), rule in listed.items() if side == "torchforge" and rule is None]
    if field in ORDERED and not missing and not extra:
        common_theirs, common_ours = [i for i in theirs if i in ours], [i for i in ours if i in theirs]
        if common_theirs != common_ours:
            return Finding(job, output, field, "different", "the same items in another order")
    if missing or extra:
        return Finding(job, output, field, "different", f"only the feedstock's: {missing}; only torchforge's: {extra}")
    still_open = any(rule.get("open") for rule in listed.values() if rule)
    return Finding(job, output, field, "open" if still_open else "intended")


def compare(job: Job, theirs: dict, ours: dict, differences: dict) -> list[Finding]:
    findings = []
    omitted = {rule["name"] for rule in differences.get("output", [])}
    for output in sorted(set(theirs) | set(ours)):
        their_fields = theirs.get(output, {}).get("fields", {})
        our_fields = ours.get(output, {}).get("fields", {})
        if output not in ours and output in omitted:
            findings += [Finding(job, output, f, "intended") for f in sorted(their_fields)]
            continue
        for field in sorted(set(their_fields) | set(our_fields)):
            findings.append(compare_field(job, output, field, our_fields.get(field), their_fields.get(field),
                                          differences))
    return findings


def figures(findings: list[Finding]) -> dict[tuple[str, str], dict[str, int]]:
    """{(release, platform): {compared, identical, intended, open, different}}."""
    table: dict[tuple[str, str], dict[str, int]] = {}
    for finding in findings:
        row = table.setdefault((finding.job.version, finding.job.platform),
                               {"compared": 0, "identical": 0, "intended": 0, "open": 0, "different": 0})
        row["compared"] += 1
        row[finding.status] += 1
    return table


def print_figures(findings: list[Finding]) -> None:
    print("| release | platform | fields compared | identical | listed as intended | listed as open | different |")
    print("|---|---|---|---|---|---|---|")
    for (version, platform), row in figures(findings).items():
        print(f"| {version} | {platform} | {row['compared']} | {row['identical']} | {row['intended']} | {row['open']} "
              f"| {row['different']} |")
    for finding in findings:
        if finding.status == "different":
            print(f"{finding.job.id} {finding.output} {finding.field}: {finding.detail}")


def main(argv: list[str]) -> int:
    """`--renders FILE`: keep the renders in FILE (read it where it exists), to compare again without rendering."""
    saved = Path(argv[argv.index("--renders") + 1]) if "--renders" in argv else None
    versions = [a for a in argv if re.fullmatch(r"\d+\.\d+\.\d+", a)]
    if saved and saved.is_file():
        renders = {Job(*key.split("|")): tuple(pair) for key, pair in json.loads(saved.read_text()).items()}
    else:
        renders = render_all(jobs(versions or None))
        if saved:
            saved.write_text(json.dumps({f"{j.version}|{j.platform}|{j.accel}": pair for j, pair in renders.items()}))
    differences = load_differences()
    findings = [f for job, (theirs, ours) in renders.items() for f in compare(job, theirs, ours, differences)]
    print_figures(findings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
