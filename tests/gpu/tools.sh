#!/usr/bin/env bash
# The first of two chained device calls whose scripts build with rattler-build (verify_stack.sh, speed.sh builds):
#   bash tests/gpu/tools.sh      (carry [".cache/wheels312-rb"])
# installs py-rattler-build into /tmp/gpu-tools (lib.sh's $gpu_tools), where the next call, within 30 s, adds the
# rest of torchforge's dependencies (carry [".cache/wheels312"]).
set -uo pipefail
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
mkdir -p "$gpu_tools"
install_tools "$gpu_tools" && echo "py-rattler-build in $gpu_tools: $(ls -d "$gpu_tools"/rattler_build* 2>/dev/null | tr '\n' ' ')"
