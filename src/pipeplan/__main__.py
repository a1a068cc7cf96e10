"""`python -m pipeplan`: the command line, for launchers that start a module (torchrun -m pipeplan ...)."""

from pipeplan.cli import main

if __name__ == "__main__":
    main()
