"""`python -m rsc.conformance.vectors`: write jump-v1.json again from the code."""

from __future__ import annotations

from pathlib import Path

from rsc.conformance.vectors import render

if __name__ == "__main__":
    target = Path(__file__).with_name("jump-v1.json")
    target.write_text(render(), encoding="utf-8")
    print(f"wrote {target}")
