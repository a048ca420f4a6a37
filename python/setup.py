"""muster's Python package (pure Python on top of torch). `pip install ./python` needs no
network: no pyproject.toml, so pip builds it with the setuptools already installed."""

from setuptools import setup

setup(
    name="muster",
    version="0.1.0",
    description="muster for Python workers: the shared-directory channel, the job's store "
                "and progress heartbeats",
    packages=["muster"],
    python_requires=">=3.8",
    # torch is the user's own (Debian's python3-torch, or any pip-installed torch >= 1.13);
    # python3-xxhash is optional (libxxhash through ctypes otherwise).
    install_requires=[],
)
