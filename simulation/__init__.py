"""The simulation harness: a whole fleet of simulated devices and the coordinator on one machine."""
