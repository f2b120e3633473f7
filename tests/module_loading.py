"""What importing one module loads, seen from a fresh process (a test's own process has
loaded everything already)."""

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
