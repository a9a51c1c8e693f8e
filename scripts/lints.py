"""What the lint scripts share: the Rust source files they check.

`lint-size` and `lint-codemap` import it from their own folder.
"""
import os
import subprocess

# The repository this script is in.
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def rust_files(root=None):
    """(root, paths): the `.rs` files under `root` outside `target/` and
    `.git/`, or, with no `root`, this repository's tracked `.rs` files; each
    path from the root with `/` between its parts, sorted."""
    if root is None:
        ls = subprocess.run(["git", "ls-files", "-z", "*.rs"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
        return ROOT, sorted(p for p in ls.split("\0") if p)
    out = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("target", ".git")]
        for n in names:
            if n.endswith(".rs"):
                out.append(os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/"))
    return root, sorted(out)
