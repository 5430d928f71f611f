"""The experiment package as a whole: it sits below the CLI (nothing in it imports
servelab.cli), and its folders import one another one way only (the tree is the
architecture)."""

from __future__ import annotations

import ast
from pathlib import Path

import servelab.experiment


def test_nothing_in_the_experiment_package_imports_the_cli():
    # the CLI is a leaf: presentation the CLI and `servelab demo` share lives in experiment/
    root = Path(servelab.experiment.__file__).parent
    offenders = []
    for f in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            offenders += [f"{f.relative_to(root)}: {n}" for n in names
                          if n.startswith("servelab.cli")]
    assert offenders == []


# what each folder of experiment/ may import of the others: the tree is the architecture
ALLOWED = {
    "design": set(),
    "deploy": set(),
    "plan": {"design", "deploy"},
    "stats": {"design"},
    "run": {"design", "plan", "deploy", "stats"},
    "report": {"design", "stats"},
}


def test_imports_between_the_folders_run_one_way():
    root = Path(servelab.experiment.__file__).parent
    offenders = []
    for folder, allowed in ALLOWED.items():
        for f in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                for n in names:
                    parts = n.split(".")
                    if parts[:2] == ["servelab", "experiment"] and len(parts) > 2:
                        other = parts[2]
                        if other != folder and other not in allowed:
                            offenders.append(f"{folder}/{f.name} imports {n}")
    assert offenders == []
