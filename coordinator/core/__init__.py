"""The vocabulary that the methods (`coordinator.strategies`) and the round loop (`coordinator.runtime`)
share: a job's settings and held-out data (`federation`), the lr schedule (`lr_schedule`), what the
coordinator knows of a device (`device_record`), a validated update (`received_update`) and a
method's checkpoint tensors as named groups (`tensor_groups`).

This layer sits below both: it imports nothing of ``coordinator.strategies``,
``coordinator.runtime``, ``coordinator.homeassistant`` or ``coordinator.cli``
(tests/project/test_import_graph.py).
"""
