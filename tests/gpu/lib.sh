# Sourced by the device scripts: the checkout ($src), the machine's Python ($PY) and its site-packages ($site),
# the tool wheels' folder ($tool_wheels), `stamp`, and `clean_venv`.
# shellcheck shell=bash
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tool_wheels="${TOOL_WHEELS:-.cache/wheels312}"
case "$tool_wheels" in /*) ;; *) tool_wheels="$src/$tool_wheels" ;; esac
# py-rattler-build apart (tests/gpu/tool_wheels.sh): the two folders with the tree are over one call's 64 MiB, so
# a call that builds first installs py-rattler-build alone (`bash tests/gpu/tools.sh`, carry [".cache/wheels312-rb"])
# into $gpu_tools, which stays while the machine is warm; the next call adds the rest there.
rattler_build_wheels="${TOOL_WHEELS_RB:-$src/.cache/wheels312-rb}"
gpu_tools=/tmp/gpu-tools

# torchforge's dependencies into $1 (a --target folder): the folders of them that this call carried
install_tools() {
  local wheels=() folder
  for folder in "$tool_wheels" "$rattler_build_wheels"; do
    [ -d "$folder" ] && wheels+=("$folder"/*.whl)
  done
  [ ${#wheels[@]} -gt 0 ] || { echo "no tool wheels carried ($tool_wheels, $rattler_build_wheels)" >&2; return 3; }
  $PY -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$1" "${wheels[@]}"
}
PY=/opt/torch/.venv/bin/python3
[ -x "$PY" ] || PY="$(command -v python3)"
site="$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
export PYTHONUNBUFFERED=1
stamp() { echo "[$(date +%T)] $*"; }

# A venv of the base interpreter (no pip torch, no nvidia-*) in $1/venv that sees only the pure-Python requirements
# of the machine's torch, linked from its site-packages into $1/pure.
clean_venv() {
  local base vsite name
  base="$($PY -c 'import sys; print(sys.base_prefix)')"
  "$base/bin/python3" -m venv --without-pip "$1/venv" || "$PY" -m venv --without-pip "$1/venv"
  mkdir -p "$1/pure"
  for name in typing_extensions.py sympy mpmath networkx jinja2 markupsafe filelock fsspec numpy numpy.libs PIL \
              pillow.libs cuda_pathfinder; do
    [ -e "$site/$name" ] && ln -s "$site/$name" "$1/pure/$name"
  done
  vsite="$("$1/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$1/pure" > "$vsite/pure-deps.pth"
}
