"""A device's data: public datasets and the sensor archives (datasets.py, sensor_datasets.py, the
.ts format), how a job splits them over devices (partition.py), the job's normalisation
(preprocessing.py), the held-out share a device evaluates on (holdout.py) and arrays spilled to disk."""
