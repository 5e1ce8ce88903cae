"""How a device and the coordinator talk: an MQTT transport over paho (transport.py), one network
thread for many connections (network_loop.py), envelopes chunked and reassembled over it (link.py),
a receive queue fair between senders (fair_inbox.py) and the token bucket its budgets use."""
