"""Placeholder until the Ascend family lands (built by nothing yet)."""


def build_family(config, switches) -> list:
    return []
