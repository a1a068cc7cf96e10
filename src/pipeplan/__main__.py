"""`python -m pipeplan`: the command line, for launchers that start a module (torchrun -m pipeplan ...).

Note:
    `python -m` puts the working folder first on the import path, so a `numpy.py` or `torch.py` lying there would
    be imported instead of the real one. It is taken off before anything else is imported (a module named on the
    command line is still found there: models.specs looks in the working folder last). A `pipeplan.py` there is
    found by `python -m` itself, before this runs: the installed `pipeplan` script, or `python -P -m pipeplan`,
    never looks there.
"""

import os
import sys

if __name__ == "__main__":
    if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    from pipeplan.cli import main

    main()
