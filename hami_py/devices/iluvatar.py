"""Placeholder until this family's module lands (built by nothing yet)."""


def build_family(config, switches) -> list:
    return []
