"""``vllm.general_plugins`` entry point: registers ``--load-format belayer`` in every vLLM process."""


def register() -> None:
    from . import weights  # noqa: F401  (registers the loader)
