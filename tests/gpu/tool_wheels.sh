#!/usr/bin/env bash
# The tool wheels the device scripts carry (the machine has no network): torchforge's dependencies as cp312
# manylinux wheels, from pyproject.toml's [project] dependencies, downloaded here (PyPI).
#   bash tests/gpu/tool_wheels.sh     ->  .cache/wheels312     everything but py-rattler-build (~32 MiB)
#                                         .cache/wheels312-rb  py-rattler-build alone (~27 MiB)
# Two folders because one call carries at most 64 MiB with the tree; stack_file.sh's call 2 adds the second.
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$src"
mapfile -t requirements < <(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
download() {  # DIR REQUIREMENT...
  local dir="$1"; shift
  rm -rf "$dir.partial" && mkdir -p "$dir.partial"
  python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$dir.partial" "$@"
  rm -rf "$dir" && mv "$dir.partial" "$dir"  # all or nothing: a rerun after an interrupted one starts over
  echo "$dir: $(find "$dir" -name '*.whl' | wc -l) wheels, $(du -sm "$dir" | cut -f1) MiB"
}
others=()
for requirement in "${requirements[@]}"; do
  case "$requirement" in py-rattler-build*) rattler_build="$requirement" ;; *) others+=("$requirement") ;; esac
done
download .cache/wheels312 "${others[@]}"
download .cache/wheels312-rb --no-deps "$rattler_build"
