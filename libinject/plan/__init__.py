"""Stage 3, the plan: (Request, Driver) -> ContainerEdits, pure (selection, requirements, procfs, csv)."""
