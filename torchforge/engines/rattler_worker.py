"""Worker process of the embedded engine: build one recipe.yaml with py-rattler-build, print its log."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchforge.engines.rattler_worker")
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--channel", action="append", default=[])
    parser.add_argument("--no-test", action="store_true")
    # an output about to be built (name-version-build): its entry in rattler's package cache goes first
    parser.add_argument("--fresh", action="append", default=[])
    args = parser.parse_args(argv)

    from torchforge.engines.package_cache import evict

    for entry in evict(args.fresh, os.environ):
        print(f"removed {entry} from the package cache: the test installs this build's package", flush=True)

    from pathlib import Path

    from rattler_build import RattlerBuildError, Stage0Recipe, ToolConfiguration, VariantConfig

    from torchforge.engines.unsolvable import explain

    lines: list[str] = []

    class PrintLog:
        """Stream the engine's log (build script output included) as it happens, so a failure keeps it."""

        def on_log(self, event: object) -> None:
            message = str(getattr(event, "message", event))
            lines.extend(message.splitlines())
            print(message, flush=True)

        def on_build_step(self, event: object) -> None:
            print(f"[{getattr(event, 'step_name', '')}] {getattr(event, 'message', '')}", flush=True)

    try:
        recipe = Stage0Recipe.from_file(Path(args.recipe) / "recipe.yaml")
        # a recipe with variant keys (the conda-forge flavour: Pythons, compilers, pins) names them next to it
        variants = Path(args.recipe) / "variants.yaml"
        results = recipe.run_build(
            variant_config=VariantConfig.from_file(variants) if variants.is_file() else None,
            tool_config=ToolConfiguration(test_strategy="skip" if args.no_test else "native"),
            output_dir=args.output_dir,
            channels=args.channel or None,
            # Small compression level: torchforge re-publishes the archive; level 19 costs minutes per PyTorch package.
            package_format="conda:3",
            progress_callback=PrintLog(),  # type: ignore[arg-type]
        )
    except RattlerBuildError as exc:
        why = explain(lines) if "Failed to resolve dependencies" in str(exc) else ""
        print(f"rattler-build failed: {exc}" + (f": {why}" if why else ""), flush=True)
        return 1
    for result in results:
        for package in result.packages:
            print(f"built {package}", flush=True)
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The log is flushed and the package written: end without interpreter teardown, where the Rust runtime's
    # threads have crashed py-rattler processes (torchforge.rattlerchild).
    os._exit(status)
