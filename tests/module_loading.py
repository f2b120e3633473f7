"""What importing one module loads, seen from a fresh process (a test's own process has
loaded everything already); which optional packages look installed."""

import importlib.util
import subprocess
import sys


def modules_loaded_by(module, prefixes):
    """The sorted names of the loaded modules that start with one of `prefixes` (a tuple of
    str) after `import module` in a fresh Python process."""
    code = (f"import sys, {module}; "
            f"print(sorted(m for m in sys.modules if m.startswith({tuple(prefixes)!r})))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    return result.stdout.strip().splitlines()[-1]


def pretend_installed(monkeypatch, packages):
    """Makes `importlib.util.find_spec` answer for `packages` (`{name: installed}`) as if
    each were installed or not; other names are looked up as usual."""
    find_spec = importlib.util.find_spec

    def patched(name, *args):
        if name in packages:
            return object() if packages[name] else None
        return find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", patched)
