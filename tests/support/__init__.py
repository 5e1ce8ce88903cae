"""What the tests share that is not a test: brokers and fleets they start, fault injection, a fake
clock, Home Assistant's discovery rules, the ``requires`` marker's parts."""
