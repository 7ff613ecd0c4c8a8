"""`torchforge explain LOGFILE`: match known failure signatures in a build or run log and say what would work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from torchforge.console import err, out
from torchforge.diagnose import catalog, explain_log, render


def register(app: typer.Typer) -> None:
    @app.command("explain")
    def explain(
        # No exists=True: explain_log raises a UsageError (exit 2, with a hint) for a missing file.
        logfile: Annotated[Path, typer.Argument(help="A build or run log.")],
        as_json: Annotated[bool, typer.Option("--json", help="Print the diagnoses as JSON.")] = False,
    ) -> None:
        """Explain a failed build or run from its log: known failure signatures, why they happen, what would work.

        Exits 0 when something was recognised, 1 when no known signature matched.
        """
        diagnoses = explain_log(logfile)
        if as_json:
            out.print_json(json.dumps([d.as_dict() for d in diagnoses]))
        elif diagnoses:
            out.print(render(diagnoses), soft_wrap=False)  # wrap inside the panels: a cropped fix is no fix
        if not diagnoses:
            # Exit 1 (not a ForgeError): "nothing recognised" is an answer, not a failure of torchforge.
            err.print(f"no known failure signature in {logfile} ({len(catalog().signatures)} signatures checked); "
                      "the end of the log usually shows the first real error")
            raise typer.Exit(code=1)
