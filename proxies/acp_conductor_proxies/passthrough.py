"""The reference proxy: forwards everything untouched. The shortest complete plugin."""

from conductor.plugins import Proxy


class Passthrough(Proxy):
    """Forwards everything untouched (the reference proxy)."""


if __name__ == "__main__":  # `python -m acp_conductor_proxies.passthrough`: run it as a stdio proxy
    from conductor.cli.plugins import run_stdio

    run_stdio(lambda: Passthrough())
