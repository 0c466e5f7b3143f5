"""`terraform-provider-rsc`: the Terraform provider's entry point, with one clear line when the
`terraform` extra (the `tf` framework) is not installed."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from rsc.tools.terraform import main as run  # noqa: PLC0415 (tf is an optional extra)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "tf":
            raise
        sys.stderr.write("terraform-provider-rsc needs the tf framework: pip install 'rsc[terraform]'\n")
        raise SystemExit(2) from None
    run()
