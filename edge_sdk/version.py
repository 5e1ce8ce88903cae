"""The edge SDK's version, written in this one place: pyproject.toml reads it when a wheel or an
editable install is built (``[tool.setuptools.dynamic]``), ``edgefl --version`` prints it and a
device registers with it (`Register.sdk_version`). tests/edge_sdk/test_version.py ties the three."""

__all__ = ["SDK_VERSION"]

SDK_VERSION = "0.4.0"
