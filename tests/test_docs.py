"""README.md and docs/: every documented shell command is checked (run, dry-run or argument parsing, as its block
is marked: tests/doccheck.py), generated tables and exact output examples are current (tests/docgen.py), and
every pointer to the documentation, from a page or from a message in the code, names a page and section that
exist."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests import docgen
from tests.doccheck import (
    MODES, ROOT, RUN_LINKS, Block, all_blocks, blocks, example, pages, parse_problem, program, quickstart, run_block,
    simple_commands,
)

BLOCKS = all_blocks()


def _ids(selected: list[Block]) -> list[str]:
    return [b.where for b in selected]


def _env() -> dict[str, str]:
    """A user's shell after `. .venv/bin/activate`: this venv's torchforge first on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "VIRTUAL_ENV": str(Path(sys.executable).parent.parent)}


def fresh_folder(tmp_path: Path) -> Path:
    """A folder like a fresh clone's, for a `run` block: the repository files the commands name, linked."""
    folder = tmp_path / "clone"
    folder.mkdir()
    for name in RUN_LINKS:
        target = Path(sys.executable).parent.parent if name == ".venv" else ROOT / name
        (folder / name).symlink_to(target)
    return folder


def test_the_extraction_finds_the_pages_and_blocks() -> None:
    assert {p.name for p in pages()} >= {"README.md", "recipes.md", "building.md", "development.md"}
    modes = {b.mode for b in BLOCKS}
    assert {"run", "dry-run", "parse", "output"} <= modes
    assert sum(len(b.lines) for b in BLOCKS) > 40


def test_every_block_is_marked_with_a_known_mode() -> None:
    bad = [f"{b.where}: {b.mode!r}" for b in BLOCKS if b.mode not in (*MODES, "output")]
    bad += [f"{b.where}: `skip` needs a reason" for b in BLOCKS if b.mode == "skip" and not b.reason]
    bad += [f"{b.where}: output kind {b.reason!r}" for b in BLOCKS if b.mode == "output" and b.reason not in ("exact", "sample")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.mode != "skip"], ids=_ids([b for b in BLOCKS if b.mode != "skip"]))
def test_every_command_parses(block: Block) -> None:
    problems = [f"{block.where}: {line}\n  {problem}" for line in block.lines for words in simple_commands(line)
                if (problem := parse_problem(words))]
    assert not problems, "\n".join(problems)


def test_the_parse_check_catches_what_a_user_would_hit() -> None:
    assert parse_problem(["torchforge", "build", "--cuda", "12.4", "--no-such-flag"])
    assert parse_problem(["torchforge", "rendr"])
    assert parse_problem(["torchforge", "build", "--jobs", "many"])
    assert parse_problem(["make", "no-such-target"])
    assert parse_problem(["python", "-m", "tests.no_such_module"])
    assert parse_problem(["torchforge", "rpath", "audit", "x.conda", "--layout", "conda"]) is None
    assert parse_problem(["torchforge", "build", "--config", "no-such.toml"]) is None  # the user's own file
    assert parse_problem(["torchforge", "matrix", "--extension", ""])  # an option's own check still counts
    assert parse_problem(["torchforge", "matrix", "--extension", "no-such-1.0.tar.gz"]) is None  # the user's file


def unmade_inputs(block: Block) -> list[str]:
    """Relative paths a documented torchforge command reads that nothing makes: not in the repository, not made
    by an earlier line of the block, not a folder a make target makes (its name is in the Makefile)."""
    made_by_make = set(re.findall(r"[\w.-]+", (ROOT / "Makefile").read_text()))
    missing, earlier = [], ""
    for line in block.lines:
        for words in simple_commands(line):
            if program(words) != "torchforge" or words[1:2] == ["promote"]:  # promote takes specs (name/version)
                continue
            for word in words[2:]:
                # absolute, variable, home and ../ paths are the user's own (a source checkout beside this one)
                if word.startswith(("-", "/", "$", "~", "../")) or "/" not in word or "://" in word:
                    continue
                first = word.split("/")[0]
                if not (ROOT / word).exists() and first not in made_by_make and first not in re.findall(r"[\w.-]+", earlier):
                    missing.append(word)
        earlier += line + "\n"
    return missing


def test_every_path_a_documented_command_reads_is_made_first() -> None:
    missing = [f"{b.where}: {path}" for b in BLOCKS if b.mode in ("parse", "dry-run") for path in unmade_inputs(b)]
    assert not missing, "no step makes these:\n" + "\n".join(missing)


def test_the_made_first_check_names_a_folder_nothing_makes() -> None:
    block = Block(ROOT / "x.md", 1, "bash", "parse", "", ("torchforge rpath fix unpacked/ --layout conda --dry-run",))
    assert unmade_inputs(block) == ["unpacked/"]
    made = Block(ROOT / "x.md", 1, "bash", "parse", "", ("mkdir unpacked", "torchforge rpath fix unpacked/ --layout conda"))
    assert unmade_inputs(made) == []


DRY = [b for b in BLOCKS if b.mode == "dry-run"]


@pytest.mark.parametrize("block", DRY, ids=_ids(DRY))
def test_dry_run_blocks_run_with_dry_run(block: Block, tmp_path: Path) -> None:
    folder = fresh_folder(tmp_path)
    for line in block.lines:
        for words in simple_commands(line):
            if program(words) != "torchforge":
                continue
            argv = words if "--dry-run" in words else [*words, "--dry-run"]
            result = run_block(Block(block.page, block.line, "bash", "run", "", (" ".join(map(_quote, argv)),)),
                               folder, env=_env(), timeout=300)
            assert result.returncode == 0, f"{block.where}: {' '.join(argv)}\n{result.stdout[-2000:]}{result.stderr[-3000:]}"


def _quote(word: str) -> str:
    import shlex

    return shlex.quote(word)


RUN = [b for b in BLOCKS if b.mode == "run"]


def compiles_an_extension(block: Block) -> bool:
    """A run block that builds an extension (README's torch-scatter block): it compiles for real."""
    return any("--extension" in line and line.startswith("torchforge build") for line in block.lines)


def _run_param(block: Block) -> object:
    """The extension's block joins the suite's torch-scatter builds (one worker, one after another, one compile
    shared through tests.test_extension_build.scatter_compile_cache); it needs the cp311 torch wheel here."""
    from tests.test_extension_build import PY, SCATTER_BUILDS

    marks = [pytest.mark.xdist_group(SCATTER_BUILDS),
             pytest.mark.skipif(PY != "3.11", reason="the torch 2.13.0 CPU wheel here is cp311")]
    return pytest.param(block, id=block.where, marks=marks if compiles_an_extension(block) else [])


@pytest.mark.slow
@pytest.mark.parametrize("block", [_run_param(b) for b in RUN])
def test_run_blocks_run_in_a_fresh_folder(block: Block, tmp_path: Path,
                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = fresh_folder(tmp_path)
    env, warm = (_extension_env(block, folder, tmp_path, tmp_path_factory) if compiles_an_extension(block)
                 else (_env(), False))
    result = run_block(block, folder, env=env, timeout=1200)
    assert result.returncode == 0, f"{block.where}\n{result.stdout[-3000:]}\n{result.stderr[-4000:]}"
    # Pasted in the checkout, the block leaves nothing git would list as untracked (except where the page says
    # the files are the user's own to commit).
    if block.page.name not in WRITES_FILES_TO_COMMIT:
        assert not untracked_in_checkout(folder), f"{block.where} leaves {untracked_in_checkout(folder)} in the checkout"
    if compiles_an_extension(block):  # built for the repacked pytorch, installed beside it, and it runs
        assert re.search(r"^2\.1\.2 tensor\(\[5\., 1\.\]\)$", result.stdout, re.M), result.stdout[-3000:]
        assert "building for pytorch-2.13.0-whl_py3.11_cpu_0" in result.stderr, result.stderr[-3000:]
        # the session compiles torch-scatter once: a build after another of the suite's takes every object
        (log,) = (folder / "try").glob("*/logs/torch-scatter-*.log")
        line = next(line for line in log.read_text().splitlines() if line.startswith("torchforge: compile cache"))
        assert not warm or re.search(r"(\d+)/\1 objects reused \(100 %\)", line), line
    elif block == example()[1]:  # the stack file's block: built, locked, the lock installed and imported
        assert re.search(r"locked \d+ package file\(s\) of the stack in stack\.lock", result.stderr)
        assert re.search(r"^2\.13\.0 3\.0 \S+/env3/lib/python3\.11/site-packages/torch/__init__\.py$", result.stdout,
                         re.M), result.stdout
    if block == quickstart():
        # Imported twice: from the local channel, then from the file:// channel it was uploaded to.
        imports = re.findall(r"^2\.13\.0 3\.0 (\S+)$", result.stdout, re.M)
        assert [Path(p).parts[-6] for p in imports] == ["env", "env2"], result.stdout
        assert "uploaded" in result.stdout
        # the conda-forge flavour's three packages: the metapackage brings pytorch and libtorch
        for package in ("pytorch-cpu-2.13.0-cpu_mkl_torchforge_h", "pytorch-2.13.0-cpu_mkl_torchforge_py311_h",
                        "libtorch-2.13.0-cpu_mkl_torchforge_h"):
            assert result.stdout.count(package) >= 2, (package, result.stdout)
        assert "flavour conda-forge" in result.stderr and "STAND-IN" in result.stderr
        # the upload's install check names what the channel leaves to the others (the stand-ins), not a solver dump
        assert re.search(r"installed without dependencies: filelock, .* come from other channels", result.stdout)
        assert "Cannot solve" not in result.stdout


def _extension_env(block: Block, folder: Path, tmp_path: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], bool]:
    """The user cache of the extension's block (XDG_CACHE_HOME) with the suite's torch 2.13.0 venv as its metadata
    venv (as tests/test_have_pytorch_stack.py gives it), and its build's default compile cache (OUT/.cache/compile)
    the session's shared one; and whether that cache held the compile already (then every object is reused)."""
    from tests.test_extension_build import scatter_compile_cache
    from tests.tool_venvs import ensure

    cache = tmp_path / "cache" / "torchforge" / "extensions"
    cache.mkdir(parents=True)
    (cache / "metadata-torch-2.13.0").symlink_to(ensure("torchcpu").parent)
    shared = scatter_compile_cache(tmp_path_factory)
    shared.mkdir(parents=True, exist_ok=True)
    warm = any(shared.glob("torch-scatter-*/[0-9a-f]/*"))
    (build,) = [words for line in block.lines for words in simple_commands(line) if words[:2] == ["torchforge", "build"]]
    out = build[build.index("--out") + 1]
    (folder / "try" / out / ".cache").mkdir(parents=True)
    (folder / "try" / out / ".cache" / "compile").symlink_to(shared)
    return {**_env(), "XDG_CACHE_HOME": str(tmp_path / "cache")}, warm


# Pages whose run blocks write files for the user to commit in their own repository, and why.
WRITES_FILES_TO_COMMIT = {"ci.md": "`torchforge ci ... --out .` writes the pipeline into the user's repository"}


def untracked_in_checkout(folder: Path) -> list[str]:
    """What a run block made in `folder` (a stand-in for the checkout's root) that git in the checkout would not
    ignore: the block's output belongs in a scratch folder git ignores."""
    made = [p.name + ("/" if p.is_dir() else "") for p in sorted(folder.iterdir()) if p.name not in RUN_LINKS]
    if not made:
        return []
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *made], cwd=ROOT, capture_output=True, text=True)
    return [name for name in made if name not in ignored.stdout.splitlines()]


def test_the_untracked_check_names_a_folder_git_would_list(tmp_path: Path) -> None:
    (tmp_path / "my-channel").mkdir()
    (tmp_path / "try").mkdir()
    assert untracked_in_checkout(tmp_path) == ["my-channel/"]


def test_the_documented_smoke_check_says_what_is_missing_where_torch_is_not_importable(tmp_path: Path) -> None:
    """docs/ci.md's `python torchforge/ci_smoke.py ...`, run by a Python without torch: one line, exit 3."""
    command = re.search(r"`(python torchforge/ci_smoke\.py [^`]*)`", (ROOT / "docs" / "ci.md").read_text())
    assert command, "docs/ci.md no longer shows how to run the smoke check by hand"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    done = subprocess.run([python, *shlex.split(command[1])[1:]], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == (f"FAILED: {python} cannot import torch (ModuleNotFoundError: No module named 'torch'); "
                           "run this check with the Python of the environment the package was installed into\n")


def test_the_publishing_page_pins_the_quetz_the_tests_run() -> None:
    """The pins of tests/tool_venvs.py, in the install line a user copies (a plain quetz-server does not start)."""
    from tests.tool_venvs import TOOLS

    lines = [line for b in blocks(ROOT / "docs" / "publishing.md") for line in b.lines]
    assert f"pip install {' '.join(TOOLS['quetz'])}" in lines


UPSTREAM_FILE = re.compile(r"(?:pytorch|conda-build|CUDA [\d.]+|MAGMA [\d.]+|cuDNN) ([\w/.-]+\.(?:py|h|cpp|cmake))\b")


def unopenable_citations(source: str) -> list[str]:
    """What a `source:` line of `torchforge explain` cites that a reader cannot open: the project's notes (seed
    files, shared/), and files neither in this repository nor named as an upstream project's."""
    bad = re.findall(r"\bseeds? \d+|\bshared/\S+", source)
    upstream = set(UPSTREAM_FILE.findall(source))
    for name in re.findall(r"[\w/.<>-]+\.(?:md|txt|log|py|j2|toml|h|cpp)\b", source):
        if name not in upstream and not (ROOT / name).exists() and not (ROOT / "docs" / name).exists():
            bad.append(name)
    return bad


def test_every_explain_source_cites_what_a_reader_can_open() -> None:
    import tomllib

    table = tomllib.loads((ROOT / "torchforge" / "data" / "failures.toml").read_text())["signatures"]
    bad = {key: found for key, sig in table.items() if (found := unopenable_citations(sig["source"]))}
    assert not bad, bad


def test_the_citation_check_names_notes_and_files_outside_the_repository() -> None:
    assert unopenable_citations("seed 000 (x); compat-facts.md §4; pytorch#1") == ["seed 000", "compat-facts.md"]
    assert unopenable_citations("pytorch torch/utils/cpp_extension.py; excerpt: tests/fixtures/failures/"
                                "relocation-overflow.log; docs/rpath.md") == []


def test_no_page_shows_the_folders_of_the_machine_that_wrote_it() -> None:
    """Output examples are run in a checkout (tests/docgen.py shows it as ~/torchforge): none shows that checkout,
    the folder its sibling checkouts live in, or the home folder."""
    mine = [f"{folder}/" for folder in (ROOT, ROOT.parent, Path.home()) if folder != Path("/")]
    shown = [f"{page.relative_to(ROOT)}:{n}: {folder}" for page in pages()
             for n, line in enumerate(page.read_text().splitlines(), 1) for folder in mine if folder in line]
    assert not shown, "\n".join(shown)


def test_the_readme_is_short_and_its_quick_start_has_at_most_ten_commands() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) < 150
    assert len(quickstart().lines) <= 10


def test_generated_tables_and_exact_outputs_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert docgen.main(["--check"]) == 0, capsys.readouterr().out + "\nrun `make docs` and review the diff"


# ---- pointers -----------------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)]


def pointer_problem(page: Path, anchor: str | None = None, section: str | None = None) -> str | None:
    if not page.is_file():
        return f"{page} does not exist"
    titles = headings(page)
    if anchor and anchor not in {slug(t) for t in titles}:
        return f"{page.relative_to(ROOT)} has no section #{anchor}"
    section = " ".join(section.split()) if section else None  # a message may wrap a section name
    if section and section not in {t.replace("`", "") for t in titles}:
        return f"{page.relative_to(ROOT)} has no section {section!r}"
    return None


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_link_in_the_documentation_names_a_page_and_section_that_exist() -> None:
    problems = []
    for page in pages():
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
        for target in LINK.findall(re.sub(r"`[^`\n]*`", "", text)):  # links in code are examples, not links
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            problem = pointer_problem((page.parent / path).resolve() if path else page, anchor or None)
            if problem:
                problems.append(f"{page.relative_to(ROOT)}: ({target}) {problem}")
    assert not problems, "\n".join(problems)


# `docs/PAGE.md`, optionally followed by `#anchor` or by a quoted section name (`, "Builds in containers"`), and
# `README, "Section"` / `README.md#anchor` (the README's own sections).
POINTER = re.compile(r"(docs/[\w/-]+\.md|README(?:\.md)?)(?:#([\w-]+)|,? [\"']([^\"']+)[\"'])?")
CODE = ("torchforge", "tests", "bench", ".ci")


def code_files() -> list[Path]:
    files = [ROOT / "Makefile"]
    for top in CODE:
        files += [p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in (".py", ".toml", ".j2", ".md", "")
                  and "fixtures" not in p.parts and p.name != "test_docs.py"]
    return files


def test_every_pointer_from_a_message_names_a_section_that_exists() -> None:
    problems, seen = [], 0
    for path in code_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for found in POINTER.finditer(text):
            seen += 1
            page = ROOT / ("README.md" if found.group(1).startswith("README") else found.group(1))
            problem = pointer_problem(page, found.group(2), found.group(3))
            if problem:
                problems.append(f"{path.relative_to(ROOT)}: {found.group(0)}: {problem}")
    assert not problems, "\n".join(problems)
    assert seen >= 3  # the container skip message, the data files' pointers ...


def test_the_pointer_check_fails_on_a_missing_section() -> None:
    assert pointer_problem(ROOT / "docs" / "channels-and-images.md", section="Builds in containers") is None
    assert pointer_problem(ROOT / "docs" / "channels-and-images.md", section="Builds in boxes")
    assert pointer_problem(ROOT / "docs" / "building.md", anchor="no-such-anchor")
    assert pointer_problem(ROOT / "docs" / "no-such-page.md")
    assert pointer_problem(ROOT / "README.md", section="Set up") is None
    assert pointer_problem(ROOT / "README.md", section="Tests and fixtures")  # moved to docs/development.md
    assert pointer_problem(ROOT / "docs" / "recipes.md", section="Custom builds never pass\n  for official ones") is None
    assert [m.group(0) for m in POINTER.finditer('see README, "Builds" and docs/a.md#b-c')] == \
        ['README, "Builds"', "docs/a.md#b-c"]
    assert slug("Quick start: build, install, publish, install again (offline)") == \
        "quick-start-build-install-publish-install-again-offline"
    assert slug("`torchforge doctor`") == "torchforge-doctor"



def test_every_documented_torchforge_toml_loads(tmp_path: Path) -> None:
    """A ```toml block with [channels] or [images] is a site config a reader copies: it must load as one."""
    from torchforge import config

    found = 0
    for page in pages():
        for body in re.findall(r"^```toml\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M):
            if not re.search(r"^\[(channels|images)", body, re.M) or re.search(r"^\[pytorch\]", body, re.M):
                continue  # not a site config (a stack file has [pytorch]: tests/test_stack_file.py reads those)
            found += 1
            path = tmp_path / f"{found}-torchforge.toml"
            path.write_text(body)
            site = config.load(path)
            assert site.channels.replace or site.channels.mirrors or site.images, (page, body)
    assert found >= 1
