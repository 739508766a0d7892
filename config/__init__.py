"""Per-environment configuration: YAML files, their schema, and the facts they are checked against."""
