"""Every method's settings, one frozen dataclass each, without torch (the registry of methods is
:mod:`edge_sdk.methods.registry`).

A method's settings dataclass is defined here, beside its device half (:mod:`edge_sdk.methods`),
and imported by its coordinator half (:mod:`coordinator.strategies`): one default, one type and one
line of help per setting (:func:`edge_sdk.methods.settings.options.option`). The ``--option``
schema, ``edgefl simulate --method M --option help``, the report's ``method_config``, the device's
reading of ``plan.train`` and the docs' options tables are all derived from it.

``python -m edge_sdk.methods.settings --markdown METHOD`` prints a method's docs table
(:mod:`edge_sdk.methods.settings.docs`);
``--write-docs`` rewrites the tables in docs/methods/, ``--check-docs`` fails when one differs.
"""

from __future__ import annotations
