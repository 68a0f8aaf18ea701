"""`python -m hubgym` is the `hubgym` command."""

from hubgym.cli import main

if __name__ == "__main__":
    main()
