"""The parts of the device client (`edge_sdk.client.DeviceClient`): its settings, connection, data,
rounds, uplink (and an update sent again), model install, re-measuring and a simulation's hooks."""
