"""`python -m vit_ft <command> ...`, the same as `vit-ft <command> ...` (see vit_ft.commands)."""

from vit_ft.commands import main

if __name__ == "__main__":
    main()
